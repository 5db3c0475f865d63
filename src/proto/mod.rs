//! Sans-IO stream decoder and encoder for the v1 wire format.
