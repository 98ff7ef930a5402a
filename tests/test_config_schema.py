"""config_schema: every key of the pretraining config is declared once, and the config, its
checks and `--config-help` come from the declarations.

The walk: for every size of each family (BERT's, and ModernBERT's from its config file), each
leaf key of the config has a declaration and each declaration of that family is a key; a
distinctive declared default is not written again under bert_jax/training or the
configs; a value outside a declared range or closed set is refused naming `config.KEY`.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import pathlib

import pytest

from bert_jax import cli
from bert_jax.configs import modernbert as modernbert_configs
from bert_jax.core.bert_config import BertConfig
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.data.preparation.settings import PrepareSettings
from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
from bert_jax.runtime import declarations
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_checks, config_lib, config_schema

ROOT = pathlib.Path(__file__).resolve().parents[1]
DECLARED = list(config_schema.keys())


SIZES = [("bert", size) for size in config_lib.SIZES]
SIZES += [("modernbert", size) for size in config_lib.MODERNBERT_SIZES]


def _config(family: str, size: str):
    """A size's config as users get it: bert:SIZE, or modernbert:SIZE (its recipe's file)."""
    if family == "modernbert":
        return modernbert_configs.get_config(size)
    return config_lib.pretraining_config(size)


@pytest.mark.parametrize("family,size", SIZES)
def test_every_key_of_every_size_is_declared_and_every_declaration_is_a_key(family, size):
    config = _config(family, size)
    keys = [key for key, _ in config_lib.flat_settings(config)]
    assert sorted(keys) == sorted(config_schema.keys(family))
    assert len(set(DECLARED)) == len(DECLARED)
    assert config.model.family == family
    config_checks.check_values(config, config_lib.split_phases(config))


def test_every_declaration_is_a_key_of_some_family():
    """The model section is both families' settings, `family` choosing; the rest is shared."""
    families = config_schema.FAMILIES
    assert set(families) == {"bert", "modernbert"}
    held = set().union(*(config_schema.keys(family) for family in families))
    assert held == set(DECLARED)
    bert, modern = (set(config_schema.keys(family)) for family in families)
    both = {key.removeprefix("model.") for key in bert & modern if key.startswith("model.")}
    assert {"family", "hidden_size", "vocab_size", "dtype", "remat"} <= both
    assert "model.hidden_act" in bert - modern
    assert "model.global_rope_theta" in modern - bert


def test_a_size_overrides_declared_keys_only():
    """The size's shapes and the CPU sizes' changes override settings, they add none."""
    assert set(config_lib.CPU_TRIAL) <= set(DECLARED)
    for family, size in SIZES:
        shapes = config_lib.model_config(size, family).to_dict()
        assert {f"model.{name}" for name in shapes} <= set(DECLARED)


def test_the_recipe_is_the_declared_defaults_at_base():
    """`base` changes nothing but the size: the shapes it sets are BertConfig's defaults."""
    config = config_lib.pretraining_config("base")
    for key in config_schema.keys("bert"):
        assert config_schema.setting_value(config, key) == config_schema.default(key), key
    second = config_schema.SECOND_PHASE
    assert config.phase1.fraction + config.phase2.fraction == 1.0
    assert config.phase2.max_seq_length == second["max_seq_length"] == 512


def test_model_and_shared_data_settings_are_their_owners_declarations():
    """The model section is BertConfig's declarations, then ModernBertConfig's for the names BERT
    has not (but the three the recipe sets its own way); the data settings `data prepare`
    shares are PrepareSettings' declarations."""
    bert = declarations.declarations(BertConfig)
    modern = declarations.declarations(ModernBertConfig)
    section = declarations.declarations(config_schema.ModelSection)
    own = {"family", "vocab_size", "vocab_pad_multiple"}
    for name, declared in section.items():
        if name not in own:
            owner, cls = (bert, BertConfig) if name in bert else (modern, ModernBertConfig)
            assert declared is owner[name], name
            assert config_schema.default(f"model.{name}") == getattr(cls, name)
    ids = {"pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"}
    assert set(bert) - set(section) == {"pad_token_id", "objective"}
    assert set(modern) - set(section) == ids  # the tokenizer's
    prepare = declarations.declarations(PrepareSettings)
    shared = [
        "masked_lm_prob",
        "short_seq_prob",
        "random_next_prob",
        "whole_word_mask",
        "mask_share",
        "same_share",
        "random_share",
        "instance_format",
        "splitter",
        "num_workers",
    ]
    for name in shared:
        assert config_schema.declaration(f"data.{name}") is prepare[name], name
        assert config_schema.default(f"data.{name}") == declarations.defaults(PrepareSettings)[name]
    # The vocabulary a run trains has the tokenizer trainer's floor, not one of its own.
    trainer = declarations.declarations(TokenizerTrainSettings)["vocab_size"]
    assert config_schema.declaration("data.tokenizer_vocab_size").low == trainer.low


# Not a setting's default: a tolerance of a float comparison.
_TOLERANCES = ("abs_tol", "rel_tol", "atol", "rtol")
# Numbers too ordinary to tell a copied default from another use of the same number.
_ORDINARY = {-1.0, 0.0, 0.1, 0.5, 0.9, 1.0}


def _distinctive(key: str, value) -> bool:
    """A default that, written again, is a copy: a number that is not round (an int of 4
    digits or more, a float other than _ORDINARY), or the default word of a closed set."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return abs(value) >= 1000
    if isinstance(value, float):
        return value not in _ORDINARY
    return isinstance(value, str) and config_schema.declaration(key).choices is not None


def _config_key(target: ast.AST) -> str | None:
    """The dotted key `config.optimizer.b2 = ...` assigns (`optimizer.b2`), else None."""
    parts = []
    while isinstance(target, ast.Attribute):
        parts.insert(0, target.attr)
        target = target.value
    is_config = isinstance(target, ast.Name) and target.id == "config" and parts
    return ".".join(parts) if is_config else None


def _written_values(tree: ast.AST):
    """(constant, line, key) for every literal the code writes as a value: assigned (a variable,
    a dict's value, a keyword argument), a parameter's default, or the fallback of `.get(k, v)`;
    `key` is the config key an assignment `config.KEY = value` writes (else None). A comparison
    (`== "per_phase"`) acts on a value; it does not write one."""
    for node in ast.walk(tree):
        values, key = [], None
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            values.append(node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            key = _config_key(targets[0]) if len(targets) == 1 else None
        elif isinstance(node, ast.Dict):
            values += node.values
        elif isinstance(node, ast.keyword) and node.arg not in _TOLERANCES:
            values.append(node.value)
        elif isinstance(node, ast.arguments):
            values += [*node.defaults, *(d for d in node.kw_defaults if d is not None)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get":
            values += node.args[1:]
        for value in values:
            if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub):
                if isinstance(value.operand, ast.Constant):
                    yield -value.operand.value, value.lineno, key
            elif isinstance(value, ast.Constant):
                yield value.value, value.lineno, key


def test_the_walk_finds_a_written_value_and_not_a_compared_one():
    code = (
        "b2 = config.get('b2', 0.999)\n"
        "def f(decay='linear', steps=-10_000): return {'eps': 1e-6}\n"
        "if decay == 'cosine' and math.isclose(x, 1, abs_tol=1e-12): g(warmup=10_000)\n"
    )
    found = [value for value, _, _ in _written_values(ast.parse(code))]
    assert sorted(map(str, found)) == sorted(map(str, [0.999, "linear", -10_000, 1e-6, 10_000]))


def test_no_distinctive_default_is_written_again():
    distinctive = {}
    for key in DECLARED:
        value = config_schema.default(key)
        if _distinctive(key, value):
            distinctive.setdefault((type(value), value), key)
    assert len(distinctive) > 10  # 1e-4, 0.999, 1e-12, 10_000, 'whole_run', 'gelu', ...
    files = [
        path
        for folder in ("bert_jax/training", "bert_jax/configs", "configs")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path.name != "config_schema.py"
    ]
    assert len(files) > 20
    copies = [
        f"{path.relative_to(ROOT)}:{line}: {value!r} is config.{distinctive[type(value), value]}'s"
        for path in files
        for value, line, key in _written_values(ast.parse(path.read_text(encoding="utf-8")))
        if not isinstance(value, bool)
        and (type(value), value) in distinctive
        and _copies(key, value)
    ]
    assert copies == []


def _copies(key: str | None, value) -> bool:
    """Whether writing `value` copies a default: anywhere but into a config key of another
    default (ModernBERT's weight decay 1e-5 is not its norm's epsilon)."""
    if key is None or key not in DECLARED:
        return True
    return config_schema.default(key) == value


def _outside(declared: declarations.Declaration, kind: type):
    """A value of type `kind` outside the declared range (None: unbounded)."""
    if declared.low is not None:
        value = declared.low if declared.low_open else declared.low - 1
    elif declared.high is not None:
        value = declared.high if declared.high_open else declared.high + 1
    else:
        return None
    while value in declared.also:
        value -= 1
    return kind(value)


RANGED = [
    key
    for key in DECLARED
    if config_schema.declaration(key).choices is None
    and _outside(config_schema.declaration(key), float) is not None
]
CLOSED = [key for key in DECLARED if config_schema.declaration(key).choices is not None]


def _tiny(key: str = ""):
    """bert:tiny, or modernbert:tiny for a key only ModernBERT's config holds."""
    if key and key not in set(config_schema.keys("bert")):
        return modernbert_configs.get_config("tiny")
    return config_lib.pretraining_config("tiny")


def _set(config, key: str, value) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        config = config[part]
    config[leaf] = value


@pytest.mark.parametrize("key", RANGED)
def test_a_value_outside_its_declared_range_is_refused_naming_its_key(key):
    config = _tiny(key)
    phases = config_lib.split_phases(config)
    value = _outside(config_schema.declaration(key), type(config_schema.default(key)))
    _set(config, key, value)
    with pytest.raises(UserError, match=f"^config\\.{key}={value!r} must be "):
        config_checks.check_values(config, phases)


@pytest.mark.parametrize("key", CLOSED)
def test_a_value_outside_its_closed_set_is_refused_naming_its_key(key):
    config = _tiny(key)
    _set(config, key, "no-such-value")
    with pytest.raises(UserError, match=f"^config\\.{key}='no-such-value' is not one of"):
        config_checks.check_values(config, config_lib.split_phases(_tiny(key)))


def test_a_not_set_value_beside_a_range_is_allowed():
    """`also`: -1 (a phase's learning_rate and warmup: the optimizer's), 0 (no packing)."""
    config = _tiny()
    for key in DECLARED:
        declared = config_schema.declaration(key)
        for value in declared.also:
            _set(config, key, type(config_schema.default(key))(value))
    assert config.data.dupe_factor == -1 and config.phase1.packing_factor == 0
    config_checks.check_values(config, config_lib.split_phases(config))
    assert config_schema.declaration("phase1.learning_rate").range_text() == "-1 or >= 0"


def test_choices_are_the_declarations():
    assert config_checks.CHOICES == {key: config_schema.declaration(key).choices for key in CLOSED}
    assert config_checks.CHOICES["model.dtype"] == ("float32", "bfloat16")


def test_config_help_lists_every_setting(capsys):
    """`pretrain --config-help` lists each key once with its default, range and help; with
    --config, the config's own values where they differ."""
    assert cli.main(["pretrain", "--config-help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split(" = ")[0] for line in out.splitlines() if " = " in line[:60]]
    assert listed == DECLARED
    assert "optimizer.b2 = 0.999  [in [0, 1)]\n    Adam's beta2" in out
    argv = ["pretrain", "--config", "bert:tiny", "--config.total_steps=7", "--config-help"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "total_steps = 7 (declared default 1000000)  [>= 1]" in out
    assert "data.source = 'embedded' (declared default '')" in out
    assert "\noptimizer.b2 = 0.999  [" in out  # the same as declared: said once


def test_declared_floats_are_finite_and_defaults_in_range():
    for key in DECLARED:
        declared, value = config_schema.declaration(key), config_schema.default(key)
        assert declared.allows(value), key
        assert not (isinstance(value, float) and math.isinf(value)), key
    for cls in set(config_schema.SECTIONS.values()):
        assert dataclasses.is_dataclass(cls) and declarations.undeclared(cls) == []


def test_a_setting_of_the_other_family_is_refused_naming_it():
    config = config_lib.pretraining_config("tiny")
    config.model.global_rope_theta = 1e4
    with pytest.raises(UserError, match="^config.model.global_rope_theta is not a setting of"):
        config_checks.check_values(config, config_lib.split_phases(config))
    modern = modernbert_configs.get_config("tiny")
    modern.objective = "mlm+nsp"
    modern.data.instance_format = "sentence_pairs"
    with pytest.raises(UserError, match="^config.objective='mlm\\+nsp': a ModernBERT model"):
        config_checks.check_values(modern, config_lib.split_phases(modern))
