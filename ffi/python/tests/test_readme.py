"""The README's examples run as written (the training one with fewer steps)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "README.md")


class ReadmeTest(unittest.TestCase):
    @unittest.skipUnless(os.path.exists(README), "the README is not beside the tests")
    def test_the_fm_example_trains(self) -> None:
        with open(README, encoding="utf-8") as f:
            blocks = re.findall(r"```python\n(# example: fm\n.*?)```", f.read(), re.S)
        self.assertEqual(len(blocks), 1)
        code = blocks[0].replace("STEPS = 8, 1000, 8, 256, 300", "STEPS = 8, 1000, 8, 256, 200")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, README, "exec"), {"__name__": "readme"})
        lines = out.getvalue().splitlines()
        losses = [float(m.group(1)) for m in map(re.compile(r"loss (\S+)").search, lines) if m]
        self.assertEqual(len(losses), 2, out.getvalue())
        self.assertLess(losses[-1], 0.69, "better than a coin")
        auc = float(lines[-1].split()[-1])
        self.assertGreater(auc, 0.6, out.getvalue())

    @unittest.skipUnless(os.path.exists(README), "the README is not beside the tests")
    def test_the_checkpoint_example_moves_a_ps(self) -> None:
        with open(README, encoding="utf-8") as f:
            blocks = re.findall(r"```python\n(# example: checkpoint\n.*?)```", f.read(), re.S)
        self.assertEqual(len(blocks), 1)
        out = io.StringIO()
        scope: dict[str, object] = {"__name__": "readme"}
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(blocks[0], README, "exec"), scope)
        finally:
            ckpt = scope.get("ckpt")
            if isinstance(ckpt, str):
                shutil.rmtree(ckpt, ignore_errors=True)
        lines = out.getvalue().splitlines()
        self.assertRegex(lines[0], r"^table 1: 1000 rows, \d+ bytes in .*/table-1\.swrows$")
        self.assertRegex(lines[1], r"^PS restarted at 127\.0\.0\.1:\d+: 1000 rows, as they were$")


if __name__ == "__main__":
    unittest.main()
