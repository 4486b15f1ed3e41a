"""Only what pyproject.toml cannot say: the wheel carries native libraries, so it is tagged for
this platform, but they are loaded with ctypes (no Python C API), so any CPython 3 can use it."""

from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


class NativeDistribution(Distribution):
    # Without it setuptools builds into purelib, which a non-pure wheel would then ship under
    # .data/purelib.
    def has_ext_modules(self):
        return True


setup(distclass=NativeDistribution, cmdclass={"bdist_wheel": PlatformWheel})
