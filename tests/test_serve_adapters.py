"""Many LoRA adapters served at once (zoo.adapters.lora_bank, zoo serve --adapter): each row of a
batch applies its own adapter, so a greedy reply is the same alone or among rows of other
adapters and of the base, and equals zoo.generate on the model merged with that adapter;
the server lists each adapter as a model and refuses names it does not serve."""

from __future__ import annotations

import copy
import dataclasses
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch
from test_serve import Collect, Server

import zoo
from zoo.adapters.lora import (
    LoRA,
    PartPlan,
    adapter_parameters,
    adapter_state,
    attach_lora,
    detach_lora,
    load_adapter_state,
    merge_lora,
    plan_lora,
)
from zoo.adapters.lora_bank import AdapterRows, attach_bank
from zoo.cli import main
from zoo.generation import GenerationConfig
from zoo.serve.engine import Engine, Request

SMALL = {"vocab_size": 257, "context_length": 64, "d_model": 32, "d_ff": 48}


@dataclasses.dataclass(frozen=True)
class Weights:
    """An adapter's plans and weights (what zoo.adapters.Adapter carries)."""

    plans: dict[str, PartPlan]
    state: dict[str, torch.Tensor]


def base_model() -> torch.nn.Module:
    """A tiny llama of std-1 weights: greedy decoding does not collapse into one token and
    its logits are far apart (an argmax no rounding flips)."""
    torch.manual_seed(0)
    model = zoo.build("llama-tiny", **SMALL)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g))
    return model.eval()


def trained(base: torch.nn.Module, seed: int, lora: LoRA, whole: bool = False) -> Weights:
    """An adapter of ``lora``'s shape with random weights (B nonzero)."""
    model = copy.deepcopy(base)
    plans = plan_lora(model, lora, per_part=(lambda _: False) if whole else None)
    attach_lora(model, plans)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in adapter_parameters(model):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return Weights(plans, {k: v.clone() for k, v in adapter_state(model).items()})


def merged(base: torch.nn.Module, adapter: Weights) -> torch.nn.Module:
    """``base`` with ``adapter`` folded into its weights."""
    model = copy.deepcopy(base)
    attach_lora(model, adapter.plans)
    with torch.no_grad():
        for name, p in adapter_parameters(model):
            p.copy_(adapter.state[name])
    merge_lora(model)
    return model


@pytest.fixture(scope="module")
def base() -> torch.nn.Module:
    return base_model()


@pytest.fixture(scope="module")
def adapters(base) -> dict[str, Weights]:
    """Three adapters of different ranks, scalings and targets: every projection; queries
    and one feed-forward projection; the fused qkv adapted whole (GPT-2's layout)."""
    return {
        "all": trained(base, 1, LoRA(rank=4, alpha=8)),
        "q-down": trained(base, 2, LoRA(rank=2, alpha=3, targets=("attn.q", "ffn.proj"))),
        "qkv-whole": trained(base, 3, LoRA(rank=8, alpha=4, targets=("attn.qkv",)), whole=True),
    }


IDS = torch.randint(0, 257, (4, 9), generator=torch.Generator().manual_seed(3))


def test_each_row_applies_its_own_adapter(base, adapters):
    model = copy.deepcopy(base)
    rows = attach_bank(model, adapters)
    assert rows.names == list(adapters)
    with torch.no_grad():
        rows.set([0, 1, 2, 3])
        mixed = model(IDS)
        rows.set([2] * 4)
        uniform = model(IDS)
        rows.set([3, 2, 1, 0])  # other rows, other adapters: the gathered weights follow
        turned = model(IDS)
        expected = [base(IDS[:1])[0]] + [
            merged(base, a)(IDS[i : i + 1])[0] for i, a in enumerate(adapters.values(), 1)
        ]
        assert all(not torch.allclose(want, expected[0]) for want in expected[1:])
        for got, want in zip(mixed, expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(
            uniform, merged(base, adapters["q-down"])(IDS), atol=1e-4, rtol=1e-4
        )
        for row, adapter in enumerate((3, 2, 1, 0)):
            ids = IDS[row : row + 1]
            want = merged(base, list(adapters.values())[adapter - 1])(ids) if adapter else base(ids)
            torch.testing.assert_close(turned[row], want[0], atol=1e-4, rtol=1e-4)
    assert not any("lora" in k for k in model.state_dict())  # the base's keys only
    detach_lora(model)
    with torch.no_grad():
        assert torch.equal(model(IDS), base(IDS))


def test_a_bank_refuses_what_does_not_fit_and_attaches_nothing(base, adapters):
    model = copy.deepcopy(base)
    good = adapters["all"]
    wrong_shape = Weights(good.plans, {**good.state, "blocks.0.attn.q.A": torch.zeros(3, 32)})
    with pytest.raises(ValueError, match=r"adapter 'bad': blocks\.0\.attn\.q\.A and \.B must be"):
        attach_bank(model, {"fine": good, "bad": wrong_shape})
    unknown = Weights({"blocks.9.attn.q": PartPlan(2, 1.0)}, {})
    with pytest.raises(ValueError, match=r"no such linear layer parts.*blocks\.9\.attn\.q"):
        attach_bank(model, {"fine": good, "elsewhere": unknown})
    stray = Weights(good.plans, {**good.state, "head.A": torch.zeros(2, 32)})
    with pytest.raises(ValueError, match=r"weights without a plan: \['head\.A'\]"):
        attach_bank(model, {"stray": stray})
    assert not any(hasattr(m, "lora") for m in model.modules())  # all or nothing
    rows = attach_bank(model, {"fine": good})
    with pytest.raises(ValueError, match=r"adapter indices must be in \[0, 1\]"):
        rows.set([0, 2])
    rows.set([0, 1, 1])
    with pytest.raises(ValueError, match="the adapter index has 3 rows, the batch 4"):
        model(IDS)
    assert isinstance(rows, AdapterRows)


def _serve(engine: Engine, jobs: list[tuple[list[int], int]], n: int) -> list[str]:
    """Each ``(prompt, adapter)``'s greedy reply of ``n`` tokens, all submitted at once."""
    tok = zoo.tokenizer("shakespeare-byte")
    config = GenerationConfig(max_new_tokens=n, temperature=0)
    sinks = [Collect() for _ in jobs]
    engine.submit(
        [
            Request(prompt, config, tok, sink, adapter=adapter)
            for (prompt, adapter), sink in zip(jobs, sinks, strict=True)
        ]
    )
    assert all(s.done.wait(120) for s in sinks)
    assert all(s.finish is not None and s.finish.reason == "length" for s in sinks)
    return ["".join(s.pieces) for s in sinks]


def test_a_greedy_reply_is_the_same_alone_or_mixed_and_equals_the_merged_model(base, adapters):
    tok = zoo.tokenizer("shakespeare-byte")
    prompts = [tok.encode(p) for p in ("ROMEO:", "JULIET:\nO", "KING", "Fi", "A\n", "We")]
    engine = Engine(copy.deepcopy(base), max_batch=4, max_queue=8, adapters=adapters)
    assert engine.adapter_ids == {"all": 1, "q-down": 2, "qkv-whole": 3}
    jobs = [(p, i % 4) for i, p in enumerate(prompts)]  # base and 3 adapters, 6 requests
    sizes: list[list[int]] = []  # each decoding step's adapter per row
    step = engine.runner.batch.step

    def recording_step(tokens: torch.Tensor, keys: list[object]) -> torch.Tensor:
        sizes.append(engine.runner.adapters.index.tolist())  # type: ignore[union-attr]
        return step(tokens, keys)  # type: ignore[arg-type]

    engine.runner.batch.step = recording_step  # type: ignore[method-assign]
    engine.start()
    try:
        together = _serve(engine, jobs, 12)
        alone = [_serve(engine, [job], 12)[0] for job in jobs[:4]]
    finally:
        engine.stop()
    assert together[:4] == alone
    models = [base, *(merged(base, a) for a in adapters.values())]
    for (prompt, adapter), text in zip(jobs, together, strict=True):
        ids = zoo.generate(models[adapter], [prompt], max_new_tokens=12, temperature=0)
        new = ids[0][len(prompt) :]  # type: ignore[index]
        assert text == tok.decode(new), f"adapter {adapter}"
    assert any(sorted(set(rows)) == [0, 1, 2, 3] for rows in sizes), "never one mixed step"


# -- zoo serve --adapter: a real server process -----------------------------------------------
@pytest.fixture(scope="module")
def folders(base, adapters, tmp_path_factory) -> dict[str, Path]:
    """The base saved with the byte tokenizer, two of the adapters saved as peft saves them
    (recording that base), and one trained on another base."""
    from zoo.adapters import BaseRecord, base_fingerprint, save_adapter

    root = tmp_path_factory.mktemp("adapters")
    tok = zoo.tokenizer("shakespeare-byte")
    out = {"base": zoo.save(base, root / "base", tokenizer=tok)}
    record = BaseRecord(name=None, repo=None, revision=None, sha256=base_fingerprint(base))
    for name in ("all", "qkv-whole"):
        model = copy.deepcopy(base)
        attach_lora(model, adapters[name].plans)
        load_adapter_state(model, adapters[name].state)
        out[name] = save_adapter(model, root / name, base=record, lora=LoRA(rank=8))
    other = record.__class__(None, None, None, "0" * 64)
    model = copy.deepcopy(base)
    attach_lora(model, adapters["all"].plans)
    out["elsewhere"] = save_adapter(model, root / "elsewhere", base=other, lora=LoRA(rank=4))
    return out


def test_serve_lists_each_adapter_and_replies_as_its_merged_model(
    base, adapters, folders, tmp_path
):
    server = Server(
        tmp_path,
        str(folders["base"]),
        "--served-model-name", "base",
        "--adapter", f"alpha={folders['all']}",
        "--adapter", f"beta={folders['qkv-whole']}",
        "--max-batch", "4",
    )  # fmt: skip
    try:
        client = server.client()
        assert [m.id for m in client.models.list().data] == ["base", "alpha", "beta"]
        status, card = server.request("GET", "/v1/models/beta")
        assert status == 200 and card["parent"] == "base"
        jobs = [("base", "ROMEO:"), ("alpha", "ROMEO:"), ("beta", "ROMEO:"), ("alpha", "KING")]

        def complete(job: tuple[str, str]) -> str:
            out = client.completions.create(
                model=job[0], prompt=job[1], max_tokens=10, temperature=0
            )
            assert out.model == job[0]
            return out.choices[0].text

        with ThreadPoolExecutor(len(jobs)) as pool:  # together: they share decoding steps
            texts = list(pool.map(complete, jobs))
        with pytest.raises(openai.NotFoundError) as missing:
            complete(("gamma", "A"))
        assert missing.value.code == "model_not_found"
        assert "'base', 'alpha', 'beta'" in missing.value.message
    finally:
        server.stop()
    models = {
        "base": base,
        "alpha": merged(base, adapters["all"]),
        "beta": merged(base, adapters["qkv-whole"]),
    }
    tok = zoo.tokenizer("shakespeare-byte")
    for (name, prompt), text in zip(jobs, texts, strict=True):
        expected = zoo.generate(
            models[name], prompt, tokenizer=tok, max_new_tokens=10, temperature=0
        )
        assert text == expected, name


def test_serve_refuses_a_bad_adapter_before_serving(folders, capsys):
    base = str(folders["base"])
    for spec in ("=x", "name="):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", base, "--adapter", spec])
        assert exit_.value.code == 2 and "give NAME=ADAPTER" in capsys.readouterr().err
    twice = ["--adapter", f"a={folders['all']}", "--adapter", f"a={folders['qkv-whole']}"]
    assert main(["serve", base, "--port", "0", *twice]) == 2
    assert "--adapter names ['a'] twice" in capsys.readouterr().err
    assert main(["serve", base, "--port", "0", "--adapter", "a=/no/such/adapter"]) != 0
    assert "/no/such/adapter does not exist" in capsys.readouterr().err
    wrong = ["--adapter", f"a={folders['all']}", "--adapter", f"b={folders['elsewhere']}"]
    assert main(["serve", base, "--port", "0", *wrong]) != 0
    err = capsys.readouterr().err
    assert "--adapter b: this adapter was trained on an unnamed model, sha256 000000000000" in err


def test_serve_refuses_an_adapter_given_as_the_base(tmp_path, capsys):
    """An adapter folder as the base would load its base with it attached; serving it with
    --adapter beside is refused, pointing to the base."""
    from zoo.adapters import BaseRecord, base_fingerprint, save_adapter

    model = zoo.load("shakespeare-byte")
    record = BaseRecord("shakespeare-byte", None, None, base_fingerprint(model))
    lora = LoRA(rank=2, targets=("attn.proj",))
    attach_lora(model, plan_lora(model, lora))
    save_adapter(model, tmp_path / "notes", base=record, lora=lora)
    served = ["serve", str(tmp_path / "notes"), "--port", "0"]
    assert main([*served, "--adapter", f"b={tmp_path / 'notes'}"]) != 0
    err = capsys.readouterr().err
    assert "is an adapter (or a LoRA run), not a base: serve its base" in err
