"""ModernBERT (core/modernbert.py) against transformers' ModernBertForMaskedLM, and `convert` in
and out of its directories (convert/hf_modernbert.py, convert/modernbert_names.py).

Random transformers models of several shapes (global attention only; sliding-window layers with
every bias on; odd lengths; padding; packed rows against the instances run one by one) give the
same MLM logits, final hidden states and MLM loss in float32 with dropout off, within 1e-5. The
directory round trip is strict both ways (every tensor used; transformers loads the export with
no missing or unexpected key) and keeps the BPE tokenizer's ids.
"""

from __future__ import annotations

import json
import os
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
import torch
import transformers

from bert_jax import cli
from bert_jax.convert import hf_modernbert, model_dir, modernbert_names
from bert_jax.convert.strict import ConversionError
from bert_jax.core import optim, partitioning, trainer
from bert_jax.core.modernbert import ModernBertForMaskedLM
from bert_jax.core.modernbert_config import ModernBertConfig
from bert_jax.data.tokenizers.hf_bpe import HfBpeTokenizer
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from bert_jax.runtime.declarations import undeclared
from bert_jax.runtime.errors import UserError
from tests.modernbert_fixtures import TINY, hf_masked_lm, params_from_hf

TOLERANCE = 1e-5
CASES = {
    # Global attention in every layer, no biases (ModernBERT's default), a padded vocabulary.
    "global_only": ModernBertConfig(**TINY, global_attn_every_n_layers=1, vocab_pad_multiple=16),
    # Layers 1 and 2 attend within +-3 positions; every bias on but the decoder's; einsum path.
    "local_layers": ModernBertConfig(
        **{**TINY, "hidden_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4},
        global_attn_every_n_layers=3,
        local_attention=6,
        global_rope_theta=1000.0,
        local_rope_theta=100.0,
        norm_bias=True,
        attention_bias=True,
        mlp_bias=True,
        classifier_bias=True,
        decoder_bias=False,
        classifier_activation="gelu_new",
        attention_impl="xla",
    ),
}
LENGTH = 19  # odd, and longer than the sliding window


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    config = CASES[request.param]
    model = hf_masked_lm(config, seed=len(request.param))
    module = ModernBertForMaskedLM(config)

    def forward(params, batch):  # the trainer's sums and the model's outputs, one program
        sums = trainer.compute_sums(params, batch, module, deterministic=True)
        return sums | module.apply({"params": params}, **trainer.model_inputs(batch))

    return request.param, config, model, params_from_hf(model, config), jax.jit(forward)


def _batch(rng, lengths, config, predictions=5, **packed):
    """Rows of `lengths` real tokens (then padding); `predictions` masked-LM targets in each,
    weighted among slots at every position (so the head runs at every position too)."""
    rows = len(lengths)
    ids = rng.integers(5, config.vocab_size, (rows, LENGTH))
    mask = (np.arange(LENGTH)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask == 1, ids, config.pad_token_id)
    chosen = np.stack([rng.choice(n, predictions, replace=False) for n in lengths])
    weights = np.zeros((rows, LENGTH), np.float32)
    np.put_along_axis(weights, chosen, 1.0, axis=1)
    return {
        "input_ids": ids.astype(np.int32),
        "input_mask": mask,
        "segment_ids": np.zeros_like(mask),
        "masked_lm_positions": np.tile(np.arange(LENGTH, dtype=np.int32), (rows, 1)),
        "masked_lm_ids": rng.integers(5, config.vocab_size, (rows, LENGTH)).astype(np.int32),
        "masked_lm_weights": weights,
        **packed,
    }


def _hf_forward(model, batch):
    """transformers' logits, final hidden states and mean MLM loss (labels where weighted)."""
    labels = np.where(batch["masked_lm_weights"] > 0, batch["masked_lm_ids"], -100)
    ids, mask = torch.tensor(batch["input_ids"]).long(), torch.tensor(batch["input_mask"])
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor(labels).long())
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    return out.logits.numpy(), hidden.numpy(), float(out.loss)


def _global_everywhere(config, model, ids):
    """transformers' logits of `model`'s weights with every layer global."""
    values = hf_modernbert.hf_config_from(config.replace(global_attn_every_n_layers=1))
    changed = transformers.ModernBertConfig(**values, attn_implementation="eager")
    other = transformers.ModernBertForMaskedLM(changed).eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        return other(input_ids=torch.tensor(ids)).logits.numpy()


def test_logits_hidden_states_and_loss_equal_transformers_with_padding(case):
    name, config, model, params, forward = case
    batch = _batch(np.random.default_rng(0), [LENGTH, 12], config)
    ours = forward(params, {k: jnp.asarray(v) for k, v in batch.items()})
    logits, hidden, loss = _hf_forward(model, batch)
    real = batch["input_mask"].astype(bool)
    logit_diff = np.abs(np.asarray(ours["mlm_logits"]) - logits)[real].max()
    hidden_diff = np.abs(np.asarray(ours["sequence_output"]) - hidden)[real].max()
    our_loss = float(ours["mlm_loss_sum"]) / float(ours["mlm_weight"])
    print(f"{name}: logits {logit_diff:.2e}, hidden {hidden_diff:.2e}, loss {our_loss - loss:.2e}")
    assert logit_diff <= TOLERANCE and hidden_diff <= TOLERANCE
    assert abs(our_loss - loss) <= TOLERANCE
    if config.padded_vocab_size != config.vocab_size:  # padding columns: out of the softmax
        padding = np.asarray(ours["mlm_logits_padded"])[..., config.vocab_size :]
        assert padding.size and np.all(padding == np.finfo(np.float32).min)
    if name == "local_layers":  # the window matters: global attention everywhere differs
        assert (
            np.abs(logits[:1] - _global_everywhere(config, model, batch["input_ids"][:1])).max()
            > 1e-3
        )


def test_packed_row_equals_the_instances_run_one_by_one(case):
    """Instances packed into rows with padding (segment ids, positions restarting at each)
    give what transformers gives each instance alone, at every real position, and the same
    MLM loss over them."""
    name, config, model, params, forward = case
    rows = ((10, 7), (4, 6, 5))
    segments, positions = np.zeros((2, LENGTH), np.int32), np.zeros((2, LENGTH), np.int32)
    for row, lengths in enumerate(rows):
        for segment, start in enumerate(np.cumsum((0,) + lengths[:-1])):
            n = lengths[segment]
            segments[row, start : start + n] = segment + 1
            positions[row, start : start + n] = np.arange(n)
    batch = _batch(
        np.random.default_rng(1),
        [sum(lengths) for lengths in rows],
        config,
        packed_segment_ids=segments,
        position_ids=positions,
    )
    out = forward(params, {k: jnp.asarray(v) for k, v in batch.items()})
    worst, nll, weight = 0.0, 0.0, 0.0
    for row, lengths in enumerate(rows):
        for start, n in zip(np.cumsum((0,) + lengths[:-1]), lengths):
            alone = {k: v[row : row + 1, start : start + n] for k, v in batch.items()}
            logits, _, loss = _hf_forward(model, alone)
            ours = np.asarray(out["mlm_logits"])[row, start : start + n]
            worst = max(worst, np.abs(ours - logits[0]).max())
            count = alone["masked_lm_weights"].sum()
            if count:
                nll, weight = nll + loss * count, weight + count
    loss_diff = float(out["mlm_loss_sum"]) / float(out["mlm_weight"]) - nll / weight
    print(f"{name} packed: logits {worst:.2e}, loss {loss_diff:.2e}")
    assert worst <= TOLERANCE and abs(loss_diff) <= TOLERANCE


def test_fused_kernel_reads_the_sliding_window_and_packing(monkeypatch):
    """attention_impl="pallas" (our fused kernel, run by Pallas' interpreter here) computes what
    the einsums compute under the sliding-window, packing and padding mask."""
    from bert_jax.core import attention

    config = CASES["local_layers"].replace(num_hidden_layers=2, global_attn_every_n_layers=2)
    batch = _batch(
        np.random.default_rng(3),
        [LENGTH, 12],
        config,
        packed_segment_ids=np.array([[1] * 10 + [2] * 9, [1] * 5 + [2] * 7 + [0] * 7], np.int32),
        position_ids=np.array(
            [[*range(10), *range(9)], [*range(5), *range(7), *[0] * 7]], np.int32
        ),
    )
    inputs = {k: jnp.asarray(v) for k, v in trainer.model_inputs(batch).items()}
    # transformers' random weights (flax's init of this model compiles for over 10 CPU-s), each
    # forward compiled (eagerly, the interpreter's loops go op by op).
    params = params_from_hf(hf_masked_lm(config, seed=3), config)
    einsums = jax.jit(ModernBertForMaskedLM(config).apply)({"params": params}, **inputs)
    einsums = einsums["mlm_logits"]
    monkeypatch.setattr(attention, "force_interpret", True)  # read when the kernel is traced
    fused = ModernBertForMaskedLM(config.replace(attention_impl="pallas"))
    logits = jax.jit(fused.apply)({"params": params}, **inputs)["mlm_logits"]
    real = batch["input_mask"].astype(bool)
    assert np.abs(np.asarray(logits) - np.asarray(einsums))[real].max() <= TOLERANCE


# --- Directories and the command ---


def _bpe_tokenizer_json(vocab_size: int) -> str:
    """A byte-level BPE tokenizer.json with ModernBERT's special tokens, trained on a few
    sentences (as ModernBERT's: GPT-NeoX-style pre-tokenizer, [CLS] $A [SEP] template)."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    train = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        "The quick brown fox jumps over the lazy dog.",
        "Encoders read the whole sentence at once; decoders read it left to right.",
        "Rotary positions turn queries and keys by their position.",
    ]
    tokenizer.train_from_iterator(text * 20, train)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return tokenizer.to_str()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    config = CASES["global_only"].replace(vocab_pad_multiple=1)
    model = hf_masked_lm(config, seed=7)
    path = tmp_path_factory.mktemp("modernbert") / "hf"
    model.save_pretrained(path)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizers.Tokenizer.from_str(_bpe_tokenizer_json(300)),
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(path)
    return path, model, fast


SENTENCE = "The lazy fox reads [MASK] positions, left to right."


def test_convert_in_and_out_is_strict_and_equal(hf_dir, tmp_path, capsys):
    src, model, fast = hf_dir
    out, back = tmp_path / "ours", tmp_path / "back"
    assert cli.main(["convert", "--from", "hf", str(src), "--to", "bert-jax", str(out)] + [
        "--vocab-pad-multiple", "16"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "ModernBERT, 2 layers" in printed and " 0 ignored" in printed
    loaded = model_dir.load_model_dir(out, load_tokenizer=True)
    assert isinstance(loaded.config, ModernBertConfig) and loaded.config.padded_vocab_size == 304
    assert json.loads((out / "config.json").read_text())["model_type"] == "modernbert"
    tokenizer = loaded.tokenizer
    assert tokenizer.kind == "bpe"
    ids = [tokenizer.cls_id, *tokenizer.encode(SENTENCE), tokenizer.sep_id]
    assert ids == fast(SENTENCE)["input_ids"]
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([ids])).logits.numpy()
    ours = jax.jit(ModernBertForMaskedLM(loaded.config).apply)(
        {"params": loaded.params}, jnp.asarray([ids]), jnp.ones((1, len(ids)), jnp.int32)
    )["mlm_logits"]  # compiled: eagerly, the forward goes op by op
    assert np.abs(np.asarray(ours) - reference).max() <= TOLERANCE

    assert cli.main(["convert", "--from", "bert-jax", str(out), "--to", "hf", str(back)]) == 0
    exported, info = transformers.ModernBertForMaskedLM.from_pretrained(
        back, output_loading_info=True
    )
    assert all(not keys for keys in info.values()), info
    for key, value in model.state_dict().items():  # bit for bit, the tied decoder too
        assert torch.equal(exported.state_dict()[key], value), key
    assert transformers.AutoTokenizer.from_pretrained(back)(SENTENCE)["input_ids"] == ids


def test_convert_refuses_a_checkpoint_that_does_not_fit(hf_dir, tmp_path):
    src, model, _ = hf_dir
    config = hf_modernbert.config_from_hf(json.loads((src / "config.json").read_text()))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}

    def refused(state, match, **kwargs):
        with pytest.raises(ConversionError, match=match):
            modernbert_names.import_params(
                {k: v.shape for k, v in state.items()},
                state.__getitem__,
                kwargs.pop("config", config),
                with_heads=True,
                ignore=lambda name: "tied" if name in modernbert_names.TIED else None,
            )

    refused({k: v for k, v in state.items() if k != "model.layers.1.attn.Wo.weight"},
            "missing tensor 'model.layers.1.attn.Wo.weight'")  # fmt: skip
    refused({**state, "model.layers.1.attn.Wo.bias": np.zeros(32)}, "1 tensor.*Wo.bias")
    wider = config.replace(intermediate_size=48)
    refused(state, r"mlp.Wi.weight' has shape \(80, 32\) but this config needs \(96, 32\)",
            config=wider)  # fmt: skip
    with pytest.raises(ConversionError, match="layer_types .* not global attention every N"):
        hf_modernbert.config_from_hf(
            {"model_type": "modernbert", "num_hidden_layers": 3,
             "layer_types": ["sliding_attention", "full_attention", "full_attention"]}
        )  # fmt: skip
    untied = tmp_path / "untied"
    model.save_pretrained(untied)
    from bert_jax.convert.safetensors import read_safetensors, write_safetensors

    weights = read_safetensors(untied / "model.safetensors")
    tensors = {name: weights.read(name) for name in weights.shapes}
    tensors["decoder.weight"] = tensors["model.embeddings.tok_embeddings.weight"] + 1.0
    write_safetensors(untied / "model.safetensors", tensors, {"format": "pt"})
    with pytest.raises(ConversionError, match="untied MLM decoder"):
        hf_modernbert.params_from_hf_dir(str(untied))
    assert not os.path.exists(tmp_path / "never")
    assert cli.main(["convert", "--from", "hf", str(untied), "--to", "bert-jax",
                     str(tmp_path / "never")]) == 2  # fmt: skip
    assert not os.path.exists(tmp_path / "never")


def test_encoder_only_directory_and_dropped_heads(hf_dir, tmp_path):
    """A ModernBertModel directory (keys without "model.") converts as the encoder alone, as
    does a ModernBertForMaskedLM one with --drop-heads; the encoder's weights are the same."""
    src, model, _ = hf_dir
    model.model.save_pretrained(tmp_path / "encoder")
    (tmp_path / "encoder" / "config.json").write_text((src / "config.json").read_text())
    report = hf_modernbert.ModernBertReport("hf", str(tmp_path / "encoder"))
    config, encoder = hf_modernbert.params_from_hf_dir(str(tmp_path / "encoder"), report=report)
    assert set(encoder) == {"model"} and "encoder-only checkpoint" in report.notes
    _, dropped = hf_modernbert.params_from_hf_dir(str(src), drop_heads=True)
    assert set(dropped) == {"model"}
    jax.tree.map(np.testing.assert_array_equal, encoder, dropped)
    exported = modernbert_names.state_dict_from(encoder, config)
    assert set(exported) == set(model.model.state_dict())


def test_config_json_both_ways_and_the_older_spelling():
    config = CASES["local_layers"]
    values = hf_modernbert.hf_config_from(config)
    global_, sliding = "full_attention", "sliding_attention"
    assert values["layer_types"] == [global_, sliding, sliding, global_]
    own = ("attention_impl",)
    back = hf_modernbert.config_from_hf(values)
    assert back == config.replace(**{name: getattr(back, name) for name in own})
    older = {k: v for k, v in values.items() if k not in ("layer_types", "rope_parameters")}
    older.update(global_rope_theta=1000.0, local_rope_theta=100.0)
    assert hf_modernbert.config_from_hf(older) == back
    assert hf_modernbert.config_from_hf({**values, "dtype": "bfloat16"}).dtype == "float32"


# --- The config, its sizes, sharding ---


def test_config_is_declared_and_checked():
    assert undeclared(ModernBertConfig) == []
    with pytest.raises(UserError, match="local_attention 1 must be >= 2"):
        ModernBertConfig(local_attention=1)
    with pytest.raises(UserError, match="hidden_size=100 is not divisible by num_attention_heads"):
        ModernBertConfig(hidden_size=100)
    with pytest.raises(UserError, match="head size.*odd|= 7 is odd"):
        ModernBertConfig(hidden_size=84, num_attention_heads=12)
    with pytest.raises(UserError, match="hidden_activation 'swish' is not one of"):
        ModernBertConfig(hidden_activation="swish")


# transformers' ModernBertForMaskedLM parameters (the tied decoder once).
PUBLISHED = {"base": 149_655_232, "large": 395_881_664}


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_parameter_count_of_the_published_sizes(size):
    config = ModernBertConfig.size(size)
    with torch.device("meta"):
        reference = transformers.ModernBertForMaskedLM(
            transformers.ModernBertConfig(**hf_modernbert.hf_config_from(config))
        )
    theirs = sum(p.numel() for p in reference.parameters())
    model = ModernBertForMaskedLM(config)
    abstract = jax.eval_shape(
        lambda: model.init(jax.random.key(0), **trainer.model_inputs(trainer.dummy_batch(1, 8, 2)))
    )["params"]
    ours = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(nn.meta.unbox(abstract)))
    shapes = jax.tree.map(lambda leaf: leaf.shape, nn.meta.unbox(abstract))
    assert shapes == modernbert_names.expected_tree(config, True)
    assert ours == theirs == modernbert_names.count_parameters(config) == PUBLISHED[size]


def test_sharded_training_step_on_the_mesh():
    """Every parameter names logical axes the rules place (data 2, fsdp 2, tensor 2); the
    sharded step's first loss is the unsharded forward's, and a second step on the same batch
    lowers it (a global and a sliding-window layer)."""
    config = CASES["local_layers"].replace(attention_impl="auto", num_hidden_layers=2)
    schedule = optim.warmup_decay(1e-2, warmup_steps=0, total_steps=10)
    mesh = partitioning.make_mesh((2, 2, 2))
    sharded = trainer.ShardedTrainer(config, optim.bert_adamw(schedule), mesh, schedule=schedule)
    assert isinstance(sharded.model, ModernBertForMaskedLM)
    state = sharded.init(jax.random.key(0))
    batch = _batch(np.random.default_rng(2), [LENGTH, 12, 15, 9], config)
    batch["next_sentence_labels"] = np.zeros((4,), np.int32)
    sums = trainer.compute_sums(
        jax.device_get(nn.meta.unbox(state.params)),
        {k: jnp.asarray(v) for k, v in batch.items()},
        sharded.model,
        deterministic=True,
    )
    expected = float(sums["mlm_loss_sum"]) / float(sums["mlm_weight"])
    losses = []
    for _ in range(2):
        state, metrics = sharded.train_step(state, sharded.global_batch(batch), jax.random.key(1))
        metrics = jax.device_get(metrics)
        losses.append(float(metrics["mlm_loss_sum"]) / float(metrics["mlm_weight"]))
    assert abs(losses[0] - expected) <= TOLERANCE and losses[1] < losses[0]


# --- The tokenizer ---


def test_bpe_tokenizer_gives_transformers_ids(tmp_path):
    text = _bpe_tokenizer_json(300)
    (tmp_path / "tokenizer.json").write_text(text)
    ours = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert isinstance(ours, HfBpeTokenizer) and not ours.lowercase
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    texts = [SENTENCE, "Unseen wörds, [SEP] inside; x[MASK]y", "  spaced\ttext\n"]
    for sentence in texts:
        assert ours.encode(sentence) == fast(sentence, add_special_tokens=False)["input_ids"]
        assert ours.decode(ours.encode(sentence)) == sentence
    assert ours.mask_id not in ours.encode("a [MASK] b", allow_special=False)
    assert ours.encode_batch(texts) == [ours.encode(t, allow_special=False) for t in texts]
    assert ours.convert_ids_to_tokens([ours.cls_id, ours.pad_id]) == ["[CLS]", "[PAD]"]
    assert not ours.ordinary_ids.size or ours.mask_id not in set(ours.ordinary_ids)
    assert ours.word_start(ours.encode(" fox jumps"))[0]
    ours.save(str(tmp_path / "saved"))
    again = load_tokenizer(str(tmp_path / "saved"))
    assert again.kind == "bpe" and again.fingerprint() == ours.fingerprint()
    assert pickle.loads(pickle.dumps(ours)).encode(SENTENCE) == ours.encode(SENTENCE)
    with pytest.raises(UserError, match="keeps case as its file says"):
        load_tokenizer(str(tmp_path / "tokenizer.json"), lowercase=True)


def test_layers_share_a_trace_per_kind_and_draw_each_layers_own_masks(monkeypatch):
    """ModernBERT's layers run as calls of one traced layer per kind (the first, the global
    ones, the sliding-window ones), and with dropout on their loss and gradients are bit for bit
    those of the layers applied one by one as modules."""
    from bert_jax.core import shared_layers
    from tests.helpers import random_params
    from tests.modernbert_fixtures import CONFIG

    config = CONFIG.replace(num_hidden_layers=5, attention_dropout=0.1, mlp_dropout=0.1)
    model = ModernBertForMaskedLM(config)
    ids = np.random.default_rng(0).integers(5, config.vocab_size, (2, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 11:] = 0
    params = random_params(model, ids, mask)["params"]

    def loss(p, key):
        out = model.apply({"params": p}, ids, mask, deterministic=False, rngs={"dropout": key})
        return jnp.sum(out["mlm_logits"] ** 2)

    forward = jax.make_jaxpr(loss)(params, jax.random.key(1))
    calls = [
        eqn.params["jaxpr"]
        for eqn in forward.jaxpr.eqns
        if eqn.primitive.name == "jit" and eqn.params["name"] == "_apply"
    ]
    assert len(calls) == config.num_hidden_layers
    assert len({id(jaxpr) for jaxpr in calls}) == 3
    step = jax.jit(jax.value_and_grad(loss))
    shared = step(params, jax.random.key(1))
    monkeypatch.setattr(shared_layers, "can_share", lambda *args, **kwargs: False)
    one_by_one = jax.jit(jax.value_and_grad(loss))(params, jax.random.key(1))
    assert not np.array_equal(shared[0], jax.jit(loss)(params, jax.random.key(2)))
    for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(one_by_one), strict=True):
        np.testing.assert_array_equal(a, b)
