//! The committed header must be what cbindgen (the pinned version) generates from the code.
//! To regenerate after changing the C ABI: `STARWIRE_BLESS=1 cargo test -p starwire-ffi --test header`.

use std::path::Path;

#[test]
fn committed_header_matches_the_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = dir.join("include/starwire.h");
    if std::env::var_os("STARWIRE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/starwire.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "ffi/include/starwire.h is out of date with ffi/src/lib.rs; regenerate it with \
         `STARWIRE_BLESS=1 cargo test -p starwire-ffi --test header` and commit it"
    );
}
