"""pytest plugin of zygote-jax: `pytest --rules-check=MODULE` checks the rules MODULE registers;
`pytest --rules-audit` checks every custom derivative the test suite calls.

pytest loads this module for every run (entry point `pytest11`), so it imports nothing, jax
and `rules` included, until one of the options is given; the plugins proper are
`rules.testing._plugin` and `rules.testing._audit`. (Why a separate top-level module: importing anything inside `rules`
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
    parser.getgroup("rules").addoption(
        "--rules-audit",
        action="store_true",
        default=False,
        help="record each jax.custom_vjp / jax.custom_jvp / rules.primitive call the tests make with "
        "concrete inputs, and after the run check each recorded function with test_rrule / test_frule "
        "(one report item per function). Runs in one process (no -n).",
    )


def pytest_configure(config):
    targets = config.getoption("rules_check")
    if targets:
        from rules.testing._plugin import RulesCheckPlugin

        config.pluginmanager.register(RulesCheckPlugin(config, targets), "rules-check")
    if config.getoption("rules_audit"):
        from rules.testing._audit import RulesAuditPlugin

        config.pluginmanager.register(RulesAuditPlugin(config), "rules-audit")
