"""`--config FILE` (or $SKEWSCOPE_CONFIG): the one place a DPU's long-running commands (export,
watch, top) take their settings from -- interface, listen address, token file, inventory,
thresholds, ... -- so a systemd unit or a pod spec carries one path, not a command line.

YAML. Top-level keys apply to every command that has the option; a section named after a
command (`export:`, `watch:`, `top:`) applies to that command only and wins. A key is an
option's long name (`token-file` or `token_file`; `interface` for -i). The command line wins
over the file. Values are checked by the option itself (a bad one: one line naming the file
and line); a key no command knows, or one the section's command does not take, is an error.

    interface: pf0hpf
    inventory: /etc/skewscope/hosts.csv
    threshold: [ring_straggler.warning=0.9]
    export:
      listen: 0.0.0.0:9435
      token-file: /etc/skewscope/token
      node: dpu-017
    watch:
      webhook: [http://controller:8080/skewscope]
      mitigate: /etc/skewscope/policy.yaml
"""
from __future__ import annotations

import functools

import click

from skewscope.core.errors import EXIT_NOT_RUN, EXIT_USAGE, SkewscopeError
from skewscope.core.textfile import compose_yaml, read_text, scalar_value

#: the commands that read --config (their sections)
COMMANDS = ("export", "watch", "top")
ENV = "SKEWSCOPE_CONFIG"


class ConfigError(SkewscopeError):
    def __init__(self, msg: str, code: int = EXIT_USAGE):
        super().__init__(msg, code)


def _names(p: click.Parameter) -> set[str]:
    out = {p.name}
    for o in getattr(p, "opts", []):
        if o.startswith("--"):
            out.add(o[2:].replace("-", "_"))
    return out


def _find(cmd: click.Command, key: str) -> click.Option | None:
    k = key.replace("-", "_")
    for p in cmd.params:
        if isinstance(p, click.Option) and p.name not in ("config", "help") and k in _names(p):
            return p
    return None


def _known_anywhere(key: str) -> bool:
    from skewscope.cli import main  # the command group (lazy: the commands' modules load here)
    for name in COMMANDS:
        cmd = main.get_command(None, name)
        if cmd is not None and _find(cmd, key) is not None:
            return True
    return False


def load(path: str, ctx: click.Context) -> dict:
    """The default_map of ctx's command from the file: {param name: value}."""
    import yaml  # a dependency; the config is YAML
    cmd = ctx.command
    text = read_text(path, "the config", lambda m: ConfigError(m, EXIT_NOT_RUN), prefix="--config ")
    root = compose_yaml(text, path, ConfigError)
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}: the config is a mapping of option: value (and export:/watch:/top: sections)")
    common, section = [], []
    for kn, vn in root.value:
        if kn.value in COMMANDS:
            if not isinstance(vn, yaml.MappingNode):
                raise ConfigError(f"{path}:{kn.start_mark.line + 1}: {kn.value}: is a section (option: value lines)")
            if kn.value == cmd.name:
                section = vn.value
            else:
                from skewscope.cli import main  # the command group (lazy: the commands' modules load here)
                other = main.get_command(None, kn.value)
                for k2, _v2 in vn.value:                    # checked here too: a typo shows wherever it is
                    if other is not None and _find(other, k2.value) is None:
                        raise ConfigError(f"{path}:{k2.start_mark.line + 1}: {kn.value}: no option "
                                          f"--{k2.value.replace('_', '-')}")
            continue
        common.append((kn, vn))
    out = {}
    for scope, pairs in (("common", common), (cmd.name, section)):
        seen: dict = {}
        for kn, vn in pairs:
            key, line = kn.value, kn.start_mark.line + 1
            norm = key.replace("-", "_")
            if norm in seen:
                raise ConfigError(f"{path}:{line}: {key} is set twice (first on line {seen[norm]})")
            seen[norm] = line
            p = _find(cmd, key)
            if p is None:
                if scope == "common" and _known_anywhere(key):
                    continue                                # another command's option
                where = "" if scope == "common" else f"{cmd.name}: "
                raise ConfigError(f"{path}:{line}: {where}no option --{key.replace('_', '-')}"
                                  + (f" for {cmd.name}" if scope == "common" else ""))
            value = scalar_value(vn)
            if p.multiple and not isinstance(value, list):
                value = [value]
            try:
                value = p.type_cast_value(ctx, value)
            except click.BadParameter as e:
                raise ConfigError(f"{path}:{line}: {key}: {e.format_message()}") from None
            out[p.name] = value
    return out


def config_option(f):
    """--config FILE (or $SKEWSCOPE_CONFIG): this command's defaults from the file; the command
    line wins (docs/dpu.md "Configuration")."""
    def cb(ctx, param, value):
        if not value or ctx.resilient_parsing:
            return
        try:
            ctx.default_map = {**(ctx.default_map or {}), **load(value, ctx)}
        except SkewscopeError as e:
            click.echo(f"skewscope: {e}", err=True)
            ctx.exit(EXIT_NOT_RUN if ctx.command.name == "watch" else e.code)

    @click.option("--config", metavar="FILE", is_eager=True, expose_value=False, callback=cb, envvar=ENV,
                  help=f"read this command's settings from a YAML file (${ENV}; the command line wins)")
    @functools.wraps(f)
    def wrapper(*a, **kw):
        return f(*a, **kw)
    return wrapper
