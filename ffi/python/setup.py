"""Builds the native library of the `starwire` package with setuptools-rust.

The library is the C ABI crate (``../Cargo.toml``, ``starwire-ffi``), built as a cdylib and
loaded with ctypes (``starwire/_lib.py``): it links no Python, so one build serves every
Python 3 version, and the wheel is tagged ``py3-none-<platform>``. Release by default;
``SETUPTOOLS_RUST_CARGO_PROFILE=dev`` builds the debug profile (CI does, to reuse the
workspace's debug build). Cargo's target folder is the workspace's (``target/``, or
``$CARGO_TARGET_DIR``).
"""

from setuptools import setup
from setuptools_rust import Binding, RustExtension

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # wheel >= 0.44 moved it into setuptools
    from setuptools.command.bdist_wheel import bdist_wheel  # type: ignore[no-redef]


class PlatformWheel(bdist_wheel):  # type: ignore[misc]
    """A wheel for any Python 3 on this platform: the library does not link libpython."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    rust_extensions=[
        RustExtension(
            "starwire._native",
            path="../Cargo.toml",
            binding=Binding.NoBinding,
            # `_native.abi3.so`: a name no Python version's import system claims.
            py_limited_api=True,
        )
    ],
    cmdclass={"bdist_wheel": PlatformWheel},
)
