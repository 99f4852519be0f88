"""The env-flag registry (srt/environ.py): typed parsing with a clear error, at most 16 flags, and every
flag set by at least one test (a flag no test sets has a branch that never runs)."""

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="per-commit-cpu")

from pathlib import Path

import pytest

from sglang.srt.environ import EnvBool, EnvFlag, Envs, EnvStr, envs

TEST_ROOT = Path(__file__).resolve().parents[1]


def flag_names() -> list[str]:
    return [name for name, value in vars(Envs).items() if isinstance(value, EnvFlag)]


def test_at_most_16_flags_each_documented():
    names = flag_names()
    assert 0 < len(names) <= 16, names
    assert all(name.startswith("SGLANG_") and getattr(envs, name).doc for name in names)


def test_every_flag_is_set_by_a_test():
    """Set means: the test's text names it beside a way of setting it (override / set / an env dict / setenv)."""
    sources = [p.read_text() for p in TEST_ROOT.rglob("test_*.py") if p.name != Path(__file__).name]
    setters = (".override(", ".set(", '": "', "setenv(", "env=", '="', '= "')
    unset = []
    for name in flag_names():
        hits = [s for s in sources if name in s]
        if not any(any(setter in line for setter in setters) for s in hits for line in s.splitlines() if name in line):
            unset.append(name)
    assert unset == [], f"flags no test sets: {unset}"


def test_parsing_names_the_variable():
    class Local(Envs):
        SGLANG_TEST_ONLY_BOOL = EnvBool(False, "a test flag")
        SGLANG_TEST_ONLY_STR = EnvStr("x", "a test flag")

    flag = Local.SGLANG_TEST_ONLY_BOOL
    assert flag.get() is False
    with flag.override(True):
        assert flag.get() is True
    with flag.override("maybe"), pytest.raises(ValueError, match="SGLANG_TEST_ONLY_BOOL='maybe' is invalid"):  # type: ignore[arg-type]
        flag.get()
    assert not flag.is_set() and Local.SGLANG_TEST_ONLY_STR.get() == "x"
