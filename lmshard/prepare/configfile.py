"""The one place a prepare's options are resolved. `resolve_config` merges, in order of
precedence: command-line flags, a YAML/TOML config file, a preset (`--preset fineweb-edu`), and
the demo defaults (`--demo`), then checks every value's type and returns a validated
`PrepareConfig` (config.py). The CLI only collects flags; library users call the same function
(or build a `PrepareConfig` directly).

Config-file keys are the CLI's long option names, in dash or underscore spelling (`text-field`,
`text_field`, `no-normalize`, `split`), plus the field names of `PrepareConfig`. A string where
a list is expected is one item; a whole number may be written `1e8` or `100_000_000`.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError

# .txt/.md: auto (a document per file up to --max-chars bytes, else per paragraph), file, line, paragraph
from .config import ALIASES, META_OPTIONS, PrepareConfig, _field_types
from .values import checked


def resolve_config(*, file: str | Path | None = None, flags: Mapping[str, Any] | None = None,
                   preset: str | None = None, demo: bool = False) -> PrepareConfig:  # fmt: skip
    """The validated `PrepareConfig` for flags (None = not given) over a config file over a
    preset over the demo defaults. Raises `ConfigError` with one line naming the bad key."""
    values = load_config_file(file) if file else {}
    given = canonical({k: v for k, v in (flags or {}).items() if v is not None and v != []}, "option")
    presets = (preset, given.pop("preset", None), values.pop("preset", None))  # pop from both, then choose
    preset = next((p for p in presets if p), None)
    demos = (demo, given.pop("demo", False), values.pop("demo", False))
    demo = any(demos)
    values.update(given)
    hf = values.get("hf")
    if not preset and isinstance(hf, str) and not Path(hf).exists():
        from .documents.hf import PRESETS

        if hf in PRESETS:  # a preset's name given to --hf, as lmshard.stream takes it: that preset
            p = PRESETS[hf]
            print(f"lmshard: note: --hf {hf} read as --preset {hf} (it reads {p.hub_id}"
                  f"{f' [{p.config}]' if p.config else ''})", file=sys.stderr, flush=True)  # fmt: skip
            preset = values.pop("hf")
    if preset:
        from .documents.hf import apply_preset

        values = apply_preset(preset, values)
    if demo:
        from .demo import DEMO_DEFAULTS

        for key, value in DEMO_DEFAULTS().items():
            values.setdefault(key, value)
    if not values.get("out"):
        raise ConfigError("missing --out DIR (where to write the dataset)")
    if not values.get("inputs") and not values.get("hf"):
        raise ConfigError("name at least one input (file, directory, glob or -), or pass --hf, --preset or --demo")
    if values.get("val_by") and "val_fraction" not in values:  # --val-tokens of each input instead
        values["val_fraction"] = 0.0
    appended = _appended_shard_size(str(values["out"])) if values.get("append") else None
    if appended is not None and "tokens_per_shard" not in values:  # the dataset's, as its encoding is
        values["tokens_per_shard"] = appended
    return PrepareConfig(**values)


def _appended_shard_size(out: str) -> int | None:
    """The --tokens-per-shard a local dataset was prepared with (None: not known here)."""
    from ..format import load_metadata
    from ..remote.urls import is_url

    try:
        if is_url(out):
            from ..remote.dataset import open_remote

            meta = open_remote(out)[0]
        else:
            meta = load_metadata(out)
        size = meta.config.get("tokens_per_shard")
    except Exception:  # no dataset there (yet), or not reachable now: the run's own checks say so
        return None
    return size if isinstance(size, int) and size > 0 else None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The options of a YAML (or `.toml`) file, keys canonical and values type-checked."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror})") from None
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # both parsers raise their own error types
        raise ConfigError(f"{path}: invalid config file ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of option names to values")
    return canonical(data, f"{path}: key")


def canonical(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Map option names (dash or underscore, CLI aliases) to field names and check each value's
    type against the field. `where` prefixes error messages ("prepare.yaml: key")."""
    hints = _field_types()
    known = sorted({*hints, *META_OPTIONS, *ALIASES})
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}  # field → the key that set it

    def said(key: str) -> str:  # a flag as typed on the command line, a key as written in the file
        return "--" + key.replace("_", "-") if where == "option" else repr(key)

    for key, value in raw.items():
        name = str(key).replace("-", "_")
        target = ALIASES[name][0] if name in ALIASES else name
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0].replace('_', '-')}?)" if close else ""
            raise ConfigError(f"{where} {key!r} is not a prepare option{hint}")
        if name in META_OPTIONS:
            found = checked(key, value, META_OPTIONS[name], where)
        elif name in ALIASES:
            alias_type = bool if name.startswith("no_") else hints[target]
            found = ALIASES[name][1](checked(key, value, alias_type, where))
        else:
            found = checked(key, value, hints[name], where)
        if target in origin and out[target] != found:  # (two spellings that agree are one option given twice)
            raise ConfigError(f"{where} {said(str(key))} sets the same option as {said(origin[target])}, to another "
                              "value; keep one of them")  # fmt: skip
        origin[target], out[target] = str(key), found
    return out
