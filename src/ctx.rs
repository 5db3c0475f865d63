//! Request contexts: a pre-sized slab whose handle travels in frame headers.
