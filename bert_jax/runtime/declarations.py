"""Settings declared once: a dataclass field made by `setting(default, help, ...)` carries its
`Declaration` (help, allowed range or choices, and what it shapes), and everything else is derived
from it (STYLE 21): the command-line flag and its help (`add_flags`), the range checks
(`problems`), the settings from parsed flags (`from_args`) and back to flags (`to_flags`), and
the recorded settings a family keeps (`as_dict`; a records manifest, a trial's key, a report's
protocol block) through the declaration's flags (`records`, `trial`, `step`, `swept`).

Every family, one dataclass each (tests/test_declarations.py walks them all, `FAMILIES`):
`PrepareSettings` (data/preparation/settings.py), `TokenizerTrainSettings`
(data/tokenizers/train_settings.py), the pretraining config's sections
(training/config_schema.py, the model's from core/bert_config.py, the data keys from
`PrepareSettings`), `FinetuneSettings` (finetune/tuning/settings.py), the supervisor's `Policy`,
`TpuVm`, `Capacity` and `SlurmJob` (launch/), plan's `Space` (planning/candidates.py),
`BenchSettings` (bench/settings.py), `EncodeSettings` (inference/encode_settings.py),
`FillMaskSettings` (inference/fill_mask.py) and `EvalSettings` (training/model_eval.py). This module
imports neither NumPy nor JAX: `--help` reads it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any


class _FromTheStart:
    """`Declaration.before`'s default: the setting was recorded from the first manifest on."""

    def __repr__(self) -> str:
        return "FROM_THE_START"


FROM_THE_START: Any = _FromTheStart()


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What a setting's field says about it, beside its name, type and default.

    `low`/`high`: the allowed range (`low_open`/`high_open`: the bound itself is not allowed);
    `choices`: the allowed values; `also`: values allowed outside the range, each meaning "not
    set" (-1: the optimizer's rate; 0: no packing). What the setting shapes, read by its family:
    `records` (the prepared records: a data setting in the records' manifest and the cache key),
    `trial` (what a fine-tuning run computes: a finished run is reused only with the same value),
    `step` (the compiled train step), `swept` (`bert-jax glue` sweeps it; these values by
    default), `identity` (the model's identity beyond its size: a model directory a run starts
    from fixes it). `before`: for a `records` setting the manifest gained later, the value of
    the records prepared before it was recorded (their manifest reads as it; FROM_THE_START:
    recorded since the first manifest). `reader`: a reader option (`data prepare` hands it to
    the readers: True under the field's name, a string under that keyword).
    `parse`/`metavar`: how a flag's text becomes the value; `show`: how help and checks write a
    value, when not as `shown` does (a duration as `1h`); `flag`: the flag's name when it is not
    the field's (`--split-bytes` for `split_bytes`), "" for a setting without a flag; `zero`:
    what 0 (or None, or "") means, for help (`0: derived`). An infinite bound is written as one:
    `high=math.inf, high_open=True` allows every finite value above `low`.
    """

    help: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    records: bool = False
    trial: bool = False
    step: bool = False
    swept: tuple[Any, ...] | None = None
    identity: bool = False
    before: Any = FROM_THE_START
    reader: bool | str = False
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    show: Callable[[Any], str] | None = None
    flag: str | None = None
    zero: str = ""
    also: tuple[Any, ...] = ()

    def range_text(self) -> str:
        """`> 0`, `in [0, 1)`, `-1 or >= 0`, `one of bert, adamw-hf`, or '' (unbounded)."""
        bounded = self._bounds_text()
        if self.also and bounded:
            # A string meaning "not set" ("") is quoted, or it would not show.
            also = (repr(x) if isinstance(x, str) else shown(x) for x in self.also)
            return " or ".join([*also, bounded])
        return bounded

    def _bounds_text(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low:g}, {self.high:g}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high:g}"
        return ""

    def allows(self, value: Any) -> bool:
        if value is None:  # an optional setting left unset
            return True
        if not isinstance(value, bool) and value in self.also:
            return True
        if self.choices is not None:
            return value in self.choices
        # NaN compares false with every bound: it is in no declared range.
        bounded = self.low is not None or self.high is not None
        if bounded and isinstance(value, float) and math.isnan(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None:
            return not (value > self.high or (self.high_open and value == self.high))
        return True


def setting(default: Any, help: str, **declared: Any) -> Any:
    """A settings dataclass's field: its default and its `Declaration`."""
    return dataclasses.field(
        default=default, metadata={"declaration": Declaration(help=help, **declared)}
    )


def declared_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a settings dataclass that carry a declaration, in order."""
    return [f for f in dataclasses.fields(cls) if "declaration" in f.metadata]


def declarations(cls: type) -> dict[str, Declaration]:
    """name -> Declaration for every declared field of `cls`."""
    return {f.name: f.metadata["declaration"] for f in declared_fields(cls)}


def defaults(cls: type) -> dict[str, Any]:
    """name -> declared default for every declared field of `cls`."""
    return {f.name: f.default for f in declared_fields(cls)}


def marked(cls: type, attribute: str) -> tuple[str, ...]:
    """The names of `cls`'s declared settings whose declaration sets `attribute` (`records`,
    `identity`, ...), in order."""
    return tuple(
        name for name, declared in declarations(cls).items() if getattr(declared, attribute)
    )


def before_recorded(cls: type) -> dict[str, Any]:
    """name -> the value records made before the setting was recorded had, for every declared
    setting of `cls` recorded later than the first manifest (`Declaration.before`)."""
    return {
        name: declared.before
        for name, declared in declarations(cls).items()
        if declared.before is not FROM_THE_START
    }


def undeclared(cls: type) -> list[str]:
    """Fields of `cls` without a declaration (a test requires none)."""
    return [f.name for f in dataclasses.fields(cls) if "declaration" not in f.metadata]


def flag_name(name: str, declared: Declaration | None = None) -> str:
    """A setting's flag: `learning_rate` -> `--learning-rate` (or its declared `flag`)."""
    if declared is not None and declared.flag:
        return declared.flag if declared.flag.startswith("--") else f"--{declared.flag}"
    return "--" + name.replace("_", "-")


def problems(settings: Any, name_of: Callable[[str], str] | None = None) -> list[str]:
    """One line per declared setting of `settings` outside its range or choices, named by
    `name_of(field)` (default: its flag): `--dupe-factor 0 must be >= 1`."""
    found = []
    for name, declared in declarations(type(settings)).items():
        value = getattr(settings, name)
        if declared.allows(value):
            continue
        named = name_of(name) if name_of else flag_name(name, declared)
        written = declared.show(value) if declared.show else repr(value)
        verb = "is not" if declared.choices is not None else "must be"
        found.append(f"{named} {written} {verb} {declared.range_text()}")
    return found


def shown(value: Any) -> str:
    """A value as help shows it: `on`/`off`, `-1,1,1`, `2e-05`."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(str(x) for x in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _value_type(field: dataclasses.Field) -> str:
    """'bool', 'int', 'float', 'str' or '' from a field's annotation (a string under
    `from __future__ import annotations`) or its default."""
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    for name in ("bool", "int", "float", "str"):
        if kind == name or kind.startswith(f"{name} |") or kind.endswith(f"| {name}"):
            return name
    if field.default is not None and not isinstance(field.default, dataclasses._MISSING_TYPE):
        return type(field.default).__name__
    return ""


def flag_options(
    field: dataclasses.Field, *, unset_is_none: bool = False, default_help: str | None = None
) -> dict[str, Any]:
    """argparse options for one declared field: type (or a boolean action), choices, metavar,
    default and help with its default and range. `unset_is_none`: the flag's default is None
    (a caller's recipe then fills it), not the declared default."""
    declared: Declaration = field.metadata["declaration"]
    kind, default = _value_type(field), field.default
    limits = declared.range_text()
    about = declared.help
    if declared.zero:
        about += f" ({declared.zero})"
    if limits and declared.choices is None:
        about += f"; {limits}"
    if default_help is None:
        unset = default is None or default == ""  # `zero` says what it means
        default_help = "" if unset else f"default {(declared.show or shown)(default)}"
    options: dict[str, Any] = {
        "default": None if unset_is_none else default,
        "help": f"{about} ({default_help})" if default_help else about,
    }
    if declared.parse is not None:
        options["type"] = declared.parse
    elif kind == "bool":
        if unset_is_none or default:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options["action"] = "store_true"
    elif kind in ("int", "float"):
        options["type"] = int if kind == "int" else float
    if declared.choices is not None:
        options["choices"] = declared.choices
    if declared.metavar is not None:
        options["metavar"] = declared.metavar
    return options


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    names: Iterable[str] | None = None,
    *,
    unset_is_none: bool = False,
) -> None:
    """The flags of `cls`'s declared settings (those in `names`, default all with a flag)."""
    wanted = set(names) if names is not None else None
    for field in declared_fields(cls):
        declared: Declaration = field.metadata["declaration"]
        if declared.flag == "" or (wanted is not None and field.name not in wanted):
            continue
        parser.add_argument(
            flag_name(field.name, declared),
            dest=field.name,
            **flag_options(field, unset_is_none=unset_is_none),
        )


def from_args(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """`cls` from parsed flags: every declared setting the flags set (None: the default)."""
    values = {
        name: getattr(args, name)
        for name in declarations(cls)
        if getattr(args, name, None) is not None
    }
    return cls(**{**values, **overrides})


def as_dict(settings: Any) -> dict[str, Any]:
    """name -> value of every declared setting of `settings`: what a family records (an event
    row, a report's protocol block)."""
    return {f.name: getattr(settings, f.name) for f in declared_fields(type(settings))}


def to_flags(settings: Any) -> list[str]:
    """The flags that give `settings` again, for a command line this process starts (a detached
    child): `--flag=value` for each declared setting with a flag and a value (None: unset, left
    out), a boolean as its switch (`--keep`, or `--no-keep` for one on by default)."""
    argv = []
    for field in declared_fields(type(settings)):
        declared: Declaration = field.metadata["declaration"]
        value = getattr(settings, field.name)
        if declared.flag == "" or value is None:
            continue
        flag = flag_name(field.name, declared)
        if isinstance(value, bool):
            if value:
                argv.append(flag)
            elif field.default:
                argv.append("--no-" + flag[2:])
            continue
        text = ",".join(str(x) for x in value) if isinstance(value, tuple) else str(value)
        argv.append(f"{flag}={text}")  # one argument: a value may start with "-"
    return argv
