"""The few lines every program check shares: counting checks and the closing summary line."""
import sys

_failures = []
_passed = 0


def check(cond, what):
    """Records one check; prints what failed."""
    global _passed
    if cond:
        _passed += 1
    else:
        _failures.append(what)
        print("FAILED:", what)


def finish():
    """Prints 'N passed, M failed' and exits non-zero when anything failed."""
    print(f"{_passed} passed, {len(_failures)} failed")
    sys.exit(1 if _failures else 0)
