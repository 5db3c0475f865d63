"""The README's example runs as written (with fewer steps)."""

from __future__ import annotations

import contextlib
import io
import os
import re
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


if __name__ == "__main__":
    unittest.main()
