//! Optional protocol features a hello announces (specification 4.1), and the loss scale of
//! a rows push that one of them brings (4.9).

use core::fmt;

/// A set of optional protocol features: the `features` field of a `HELLO` and
/// `HELLO_ACK` (specification 4.1). A feature is used on a connection only when both ends
/// announced it; bits this version does not know are kept as announced and ignored.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WireFeatures(u16);

impl WireFeatures {
    /// No feature.
    pub const NONE: WireFeatures = WireFeatures(0);
    /// Bit 0: rows in another float format than their table's, and a loss scale on rows
    /// pushes (4.9).
    pub const ROW_FORMATS: WireFeatures = WireFeatures(1);
    /// Bit 1: a rows pull names the version of each row the requester holds, and the
    /// answer carries the rows' versions and leaves out the rows that did not change (4.9).
    pub const ROW_VERSIONS: WireFeatures = WireFeatures(2);
    /// Every feature this version implements.
    pub const ALL: WireFeatures = WireFeatures(1 | 2);

    /// The names of the features this version implements, with their bits.
    const NAMES: [(&'static str, WireFeatures); 2] = [
        ("row_formats", WireFeatures::ROW_FORMATS),
        ("row_versions", WireFeatures::ROW_VERSIONS),
    ];

    /// The set of the bits `bits`, unknown ones included.
    pub const fn from_bits(bits: u16) -> WireFeatures {
        WireFeatures(bits)
    }

    /// The bits, as they travel.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every feature of `other` is in this set.
    pub const fn contains(self, other: WireFeatures) -> bool {
        self.0 & other.0 == other.0
    }

    /// The features in both sets.
    pub const fn intersection(self, other: WireFeatures) -> WireFeatures {
        WireFeatures(self.0 & other.0)
    }

    /// The features in either set.
    pub const fn union(self, other: WireFeatures) -> WireFeatures {
        WireFeatures(self.0 | other.0)
    }

    /// What a connection uses when this end announced `self` and its peer `peer`: the
    /// features both announced that this version implements.
    pub const fn negotiate(self, peer: WireFeatures) -> WireFeatures {
        WireFeatures(self.0 & peer.0 & WireFeatures::ALL.0)
    }

    /// Reads a setting's text: `all`, `none`, or feature names separated by commas
    /// (`row_formats`, `row_versions`); `None` for anything else (an unknown name, blanks, an empty item).
    pub fn parse(text: &str) -> Option<WireFeatures> {
        match text {
            "all" => return Some(WireFeatures::ALL),
            "none" => return Some(WireFeatures::NONE),
            _ => {}
        }
        let mut set = WireFeatures::NONE;
        for name in text.split(',') {
            let (_, bit) = WireFeatures::NAMES.iter().find(|(n, _)| *n == name)?;
            set = set.union(*bit);
        }
        Some(set)
    }

    /// The name of a single feature this version implements.
    pub fn name_of(feature: WireFeatures) -> Option<&'static str> {
        WireFeatures::NAMES
            .iter()
            .find(|(_, bit)| *bit == feature)
            .map(|(n, _)| *n)
    }
}

impl fmt::Display for WireFeatures {
    /// `none`, or the names of the features set, separated by commas; unknown bits as
    /// `bit N`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        let mut first = true;
        for bit in 0..16 {
            let one = WireFeatures(1 << bit);
            if !self.contains(one) {
                continue;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match WireFeatures::name_of(one) {
                Some(name) => f.write_str(name)?,
                None => write!(f, "bit {bit}")?,
            }
        }
        Ok(())
    }
}

impl fmt::Debug for WireFeatures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WireFeatures({self})")
    }
}

/// The factor gradient rows of a push were multiplied by (a loss scale), which the PS
/// divides out before it applies them (specification 4.9): a positive normal f32 whose
/// reciprocal is normal too, 2^-126 to 2^126. Travels only on connections that negotiated
/// [`WireFeatures::ROW_FORMATS`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LossScale(u32);

impl LossScale {
    /// Smallest scale, 2^-126.
    pub const MIN: f32 = f32::MIN_POSITIVE;
    /// Largest scale, 2^126.
    pub const MAX: f32 = (1u128 << 126) as f32;

    /// The scale `s`, or `None` when it is not in [`MIN`](Self::MIN)..=[`MAX`](Self::MAX)
    /// (zero, negative, NaN, infinite, subnormal, or with a reciprocal that is not normal).
    pub fn new(s: f32) -> Option<LossScale> {
        (Self::MIN..=Self::MAX)
            .contains(&s)
            .then(|| LossScale(s.to_bits()))
    }

    /// The scale.
    pub fn get(self) -> f32 {
        f32::from_bits(self.0)
    }

    /// What the PS multiplies each gradient element by: the f32 nearest to `1 / scale`
    /// (exactly `1 / scale` for a power of two).
    pub fn reciprocal(self) -> f32 {
        1.0 / self.get()
    }

    /// The scale whose bits travel as `bits` (the `loss_scale` field: 0 is no scale);
    /// `Err` for bits that are neither 0 nor a scale in range.
    pub(crate) fn from_wire(bits: u32) -> Result<Option<LossScale>, ()> {
        if bits == 0 {
            return Ok(None);
        }
        LossScale::new(f32::from_bits(bits)).map(Some).ok_or(())
    }

    /// The bits of `scale` as they travel (0: none).
    pub(crate) fn to_wire(scale: Option<LossScale>) -> u32 {
        scale.map_or(0, |s| s.0)
    }
}

impl fmt::Debug for LossScale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LossScale({})", self.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_negotiate_to_what_both_announced_and_this_version_knows() {
        let peer = WireFeatures::from_bits(0b1001);
        assert_eq!(WireFeatures::ALL.negotiate(peer), WireFeatures::ROW_FORMATS);
        assert_eq!(WireFeatures::NONE.negotiate(peer), WireFeatures::NONE);
        assert_eq!(
            WireFeatures::ROW_FORMATS.negotiate(WireFeatures::from_bits(0b10)),
            WireFeatures::NONE
        );
        assert_eq!(
            WireFeatures::ALL.negotiate(WireFeatures::from_bits(0b1110)),
            WireFeatures::ROW_VERSIONS
        );
        assert_eq!(WireFeatures::ALL.bits(), 0b11);
        assert_eq!(peer.to_string(), "row_formats,bit 3");
        assert_eq!(WireFeatures::ALL.to_string(), "row_formats,row_versions");
        assert_eq!(WireFeatures::NONE.to_string(), "none");
        assert_eq!(WireFeatures::parse("all"), Some(WireFeatures::ALL));
        assert_eq!(WireFeatures::parse("none"), Some(WireFeatures::NONE));
        assert_eq!(
            WireFeatures::parse("row_formats"),
            Some(WireFeatures::ROW_FORMATS)
        );
        assert_eq!(
            WireFeatures::parse("row_versions"),
            Some(WireFeatures::ROW_VERSIONS)
        );
        assert_eq!(
            WireFeatures::parse("row_versions,row_formats"),
            Some(WireFeatures::ALL)
        );
        for bad in ["", "row_formats,", " row_formats", "ROW_FORMATS", "versions"] {
            assert_eq!(WireFeatures::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn loss_scales_are_normal_with_a_normal_reciprocal() {
        for ok in [1.0f32, 1024.0, 0.5, LossScale::MIN, LossScale::MAX, 3.0] {
            let s = LossScale::new(ok).unwrap();
            assert_eq!(s.get(), ok);
            assert!(s.reciprocal().is_normal());
            assert_eq!(LossScale::from_wire(ok.to_bits()), Ok(Some(s)));
        }
        assert_eq!(LossScale::MAX.to_bits(), 0x7e80_0000);
        for ok in [LossScale::MIN, LossScale::MAX] {
            assert_eq!(LossScale::new(ok).unwrap().reciprocal() * ok, 1.0);
        }
        for bad in [
            0.0f32,
            -0.0,
            -1.0,
            f32::NAN,
            f32::INFINITY,
            f32::MAX,
            f32::from_bits(1),
            f32::from_bits(0x007f_ffff),
            f32::from_bits(0x7e80_0001),
        ] {
            assert_eq!(LossScale::new(bad), None, "{bad:e}");
        }
        assert_eq!(LossScale::from_wire(0), Ok(None));
        assert_eq!(LossScale::from_wire((-2.0f32).to_bits()), Err(()));
        assert_eq!(LossScale::to_wire(LossScale::new(2.0)), 0x4000_0000);
        assert_eq!(LossScale::new(256.0).unwrap().reciprocal(), 1.0 / 256.0);
    }
}
