"""pytest plugin of zygote-jax: `pytest --rules-check=MODULE` checks the rules MODULE registers.

pytest loads this module for every run (entry point `pytest11`), so it imports nothing, jax
and `rules` included, until `--rules-check` is given; the plugin proper is
`rules.testing._plugin`. (Why a separate top-level module: importing anything inside `rules`
runs `rules/__init__.py`, which imports jax and the whole library.)
"""


def pytest_addoption(parser):
    parser.getgroup("rules", "rules (zygote-jax)").addoption(
        "--rules-check",
        action="append",
        default=[],
        metavar="MODULE",
        help="add one test per (function, example) of the rules that MODULE registers, as "
        "`python -m rules check MODULE` checks them: a library module (linalg), a dotted "
        "module path (mypkg.rules) or a file (path/to/myrules.py). Repeatable.",
    )


def pytest_configure(config):
    targets = config.getoption("rules_check")
    if targets:
        from rules.testing._plugin import RulesCheckPlugin

        config.pluginmanager.register(RulesCheckPlugin(config, targets), "rules-check")
