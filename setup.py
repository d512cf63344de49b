"""Only for the start-up hook: ``jit_ahead.pth`` must land at the top of site-packages, where Python's
``site`` module runs it (``JIT_AHEAD=1`` turns jit_ahead on in any process). Everything else is in
pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "jit_ahead.pth"


class BuildPyWithStartupHook(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "jit_ahead", PTH),
                       os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildPyWithStartupHook})
