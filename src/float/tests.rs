use super::kernels::{bf16_bits, f16_bits, from_bf16_bits, from_f16_bits};
use super::*;

/// f32 bit patterns worth checking: every exponent with mantissas at and around the
/// rounding points of bf16 and f16, the boundaries, a spread of others, both signs.
fn samples() -> Vec<u32> {
    let mut v = Vec::new();
    for exp in 0..=255u32 {
        for man in [
            0u32, 1, 2, 0x7f, 0x80, 0x81, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
            0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x1_8001, 0x40_0000, 0x40_0001,
            0x7f_e000, 0x7f_efff, 0x7f_f000, 0x7f_ffff,
        ] {
            v.push((exp << 23) | man);
        }
    }
    // A stride through all of them.
    v.extend((0..(1u64 << 32)).step_by(65_537).map(|b| b as u32));
    let signed: Vec<u32> = v.iter().map(|b| b | 0x8000_0000).collect();
    v.extend(signed);
    v
}

#[test]
fn bf16_rounds_to_nearest_even() {
    assert_eq!(f32_to_bf16(1.0), 0x3f80);
    assert_eq!(bf16_to_f32(0x3f80), 1.0);
    // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
    assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
    // 1 + 3 × 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
    assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
    assert_eq!(f32_to_bf16(-2.5), 0xc020);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7f80);
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
    // A signalling NaN whose payload is all in the low half stays a NaN (quiet).
    assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
    // Subnormals are rounded, not flushed.
    assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8000)), 0x0000);
    assert_eq!(f32_to_bf16(f32::from_bits(0x0001_8000)), 0x0002);
    // Every bfloat16 survives a round trip through f32.
    for h in 0..=u16::MAX {
        let x = bf16_to_f32(h);
        if !x.is_nan() {
            assert_eq!(f32_to_bf16(x), h, "{h:#x}");
        }
    }
}

#[test]
fn f16_conversions() {
    assert_eq!(f32_to_f16(1.0), 0x3c00);
    assert_eq!(f32_to_f16(-2.0), 0xc000);
    assert_eq!(f32_to_f16(65504.0), 0x7bff);
    assert_eq!(f32_to_f16(65519.99), 0x7bff);
    assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up past the largest finite
    assert_eq!(f32_to_f16(1e9), 0x7c00);
    assert_eq!(f32_to_f16(f32::NEG_INFINITY), 0xfc00);
    assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
    // The smallest subnormal, 2^-24, and half of it (a tie, to even: zero).
    assert_eq!(f32_to_f16(5.960_464_5e-8), 0x0001);
    assert_eq!(f32_to_f16(2.980_232_2e-8), 0x0000);
    assert_eq!(f32_to_f16(-0.0), 0x8000);
    // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even.
    assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
    assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
    // Every binary16 survives a round trip through f32.
    for h in 0..=u16::MAX {
        let x = f16_to_f32(h);
        if !x.is_nan() {
            assert_eq!(f32_to_f16(x), h, "{h:#x}");
        }
    }
    // Against the nearest binary16 found by search, for values between grid points.
    for i in 0..20_000u32 {
        let x = (i as f32 - 10_000.0) * 0.001_234_5;
        let h = f32_to_f16(x);
        let err = (f16_to_f32(h) - x).abs();
        for n in [h.wrapping_sub(1), h.wrapping_add(1)] {
            let y = f16_to_f32(n);
            if y.is_finite() && y.signum() == x.signum() {
                assert!(err <= (y - x).abs(), "{x}: {h:#x} vs {n:#x}");
            }
        }
    }
}

#[test]
fn the_branch_free_forms_give_the_reference_bits() {
    for b in samples() {
        let x = f32::from_bits(b);
        assert_eq!(bf16_bits(x), f32_to_bf16(x), "bf16 of {b:#010x}");
        assert_eq!(f16_bits(x), f32_to_f16(x), "f16 of {b:#010x}");
    }
    for h in 0..=u16::MAX {
        assert_eq!(
            from_bf16_bits(h).to_bits(),
            bf16_to_f32(h).to_bits(),
            "{h:#x}"
        );
        assert_eq!(
            from_f16_bits(h).to_bits(),
            f16_to_f32(h).to_bits(),
            "{h:#x}"
        );
    }
}

/// The reference conversion of one element.
fn reference(from: Float, src: &[u8], to: Float, mul: Option<f32>) -> Vec<u8> {
    let v = match from {
        Float::F32 => f32::from_le_bytes(src.try_into().unwrap()),
        Float::Bf16 => bf16_to_f32(u16::from_le_bytes(src.try_into().unwrap())),
        Float::F16 => f16_to_f32(u16::from_le_bytes(src.try_into().unwrap())),
    };
    let v = mul.map_or(v, |m| v * m);
    match to {
        Float::F32 => v.to_le_bytes().to_vec(),
        Float::Bf16 => f32_to_bf16(v).to_le_bytes().to_vec(),
        Float::F16 => f32_to_f16(v).to_le_bytes().to_vec(),
    }
}

#[test]
fn every_pair_converts_as_the_reference_does_element_by_element() {
    let formats = [Float::F32, Float::Bf16, Float::F16];
    // 37 elements: whole vectors of every width and a tail.
    let values: Vec<f32> = samples()
        .into_iter()
        .step_by(97)
        .take(37)
        .map(f32::from_bits)
        .chain([1.0, -0.0, 65519.0, 3.0e-8, f32::NAN])
        .collect();
    for from in formats {
        let mut src = vec![0u8; values.len() * from.size()];
        narrow_from(&values, from.dtype(), &mut src, None).unwrap();
        for to in formats {
            for mul in [None, Some(0.25f32), Some(1.0 / 3.0)] {
                let mut dst = vec![0u8; values.len() * to.size()];
                convert(from.dtype(), &src, to.dtype(), &mut dst, mul).unwrap();
                let want: Vec<u8> = src
                    .chunks_exact(from.size())
                    .flat_map(|e| reference(from, e, to, mul))
                    .collect();
                assert_eq!(dst, want, "{from:?} -> {to:?} times {mul:?}");
            }
            // Into f32 values.
            let mut out = vec![0f32; values.len()];
            widen_into(from.dtype(), &src, &mut out).unwrap();
            let want: Vec<u8> = src
                .chunks_exact(from.size())
                .flat_map(|e| reference(from, e, Float::F32, None))
                .collect();
            let got: Vec<u8> = out.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(got, want, "{from:?} -> values");
        }
    }
}

#[test]
fn conversions_refuse_other_formats_and_lengths() {
    let mut dst = [0u8; 4];
    assert_eq!(
        convert(DType::F64, &[0; 8], DType::F32, &mut dst, None),
        Err(ConvertError::NotFloat(DType::F64))
    );
    assert_eq!(
        convert(DType::F32, &[0; 8], DType::BF16, &mut dst, None),
        Ok(())
    );
    assert_eq!(
        convert(DType::F32, &[0; 8], DType::F32, &mut dst, None),
        Err(ConvertError::Length { src: 8, dst: 4 })
    );
    assert!(convert(DType::BF16, &[0; 3], DType::F16, &mut [0; 2], None).is_err());
    assert!(widen_into(DType::U8, &[0; 2], &mut [0.0; 2]).is_err());
    assert!(narrow_from(&[0.0; 2], DType::F16, &mut [0; 2], None).is_err());
    assert!(convertible(DType::BF16, DType::F16) && !convertible(DType::F32, DType::I32));
    let e = ConvertError::NotFloat(DType::U8).to_string();
    assert!(e.contains("f32, bf16 and f16") && e.contains("u8"), "{e}");
}

#[test]
fn narrowing_to_f16_gives_the_reference_bits_for_every_sample() {
    // Whichever kernel runs (F16C where the CPU has it), from bytes and from values, with
    // and without a factor; an odd count leaves a tail.
    let values: Vec<f32> = samples().into_iter().map(f32::from_bits).collect();
    let values = &values[..values.len() - 3];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    for mul in [None, Some(0.5f32), Some(3.0)] {
        let want: Vec<u8> = values
            .iter()
            .flat_map(|&v| f32_to_f16(mul.map_or(v, |m| v * m)).to_le_bytes())
            .collect();
        let mut dst = vec![0u8; values.len() * 2];
        convert(DType::F32, &bytes, DType::F16, &mut dst, mul).unwrap();
        assert_eq!(dst, want, "from bytes, times {mul:?}");
        let mut dst = vec![0u8; values.len() * 2];
        narrow_from(values, DType::F16, &mut dst, mul).unwrap();
        assert_eq!(dst, want, "from values, times {mul:?}");
    }
}
