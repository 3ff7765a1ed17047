"""Every load path reaches zoo's fast CPU kernels: a model loaded from its Hugging Face folder
or its GGUF file decodes at batch 1 through the one-call step (``zoo.runtime.native_block``)
at every step where the same model loaded from zoo's own checkpoint does.

GPT-2's Hugging Face layout stores its projections transposed (Conv1D); loaded as views,
they reached zoo's kernels only once the first decoding session had copied them (that
process's first generation paid for it; docs/benchmarks.md has the figures). Loading now
stores every tensor contiguously (copied once, at load). Each family runs in a child process
(zoo's C kernels: a crash fails the test, not the run), counting the step's calls as the
batch-1 guard does and the tensors not in row order.
"""

from __future__ import annotations

import pytest
from native_child import run_native

#: The families, each by a named model of it; those the one-call step computes (the others
#: decline it from every source alike: post-branch norms, q/k norms, a mixture, caps, windows).
FAMILIES = {
    "gpt2": "gpt2-124m",
    "gpt1": "gpt1",
    "llama": "smollm2-135m-instruct",
    "mistral": "mistral-7b-v0.3",
    "qwen2": "qwen2.5-0.5b-instruct",
    "qwen3": "qwen3-0.6b",
    "gpt-neox": "pythia-160m",
    "mixtral": "mixtral-tiny",
    "olmo2": "olmo-2-1b-instruct",
    "phi3": "phi-3-mini-4k-instruct",
    "gemma2": "gemma-2-2b-it",
    "gemma3": "gemma-3-1b-it",
}
ONE_CALL = {"gpt2", "gpt1", "llama", "mistral", "qwen2", "gpt-neox"}

CHILD = """
import tempfile, warnings
from pathlib import Path
import torch, zoo
from zoo.runtime import native_block
from zoo.testing.reference import randomize_parameters
from zoo.testing.small import reference_overrides
warnings.simplefilter("ignore")
named = NAMED
fused, calls = native_block.decode, []

def counted(*args):
    out = fused(*args)
    calls.append(out is not None)
    return out

native_block.decode = counted
torch.manual_seed(0)
model = zoo.build(named, **reference_overrides(named))
randomize_parameters(model)
folder = Path(tempfile.mkdtemp())
sources = {"zoo": zoo.save(model.eval(), folder / "zoo"), "hf": zoo.export(model, folder / "hf")}
try:
    sources["gguf"] = zoo.export(model, folder / "m.gguf", layout="gguf")
except zoo.CheckpointError:
    pass  # a family GGUF has no form for
for source, path in sources.items():
    loaded = zoo.load(path, tokenizer=False)
    strided = sum(not t.is_contiguous() for t in loaded.state_dict().values())
    calls.clear()
    zoo.generate(loaded, torch.tensor([[1, 2, 3, 4, 5]]), max_new_tokens=6, temperature=0)
    print("ok", source, sum(calls), len(calls), strided)
"""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_load_path_runs_the_one_call_step_where_zoo_s_own_does(family: str) -> None:
    lines = run_native(CHILD.replace("NAMED", repr(FAMILIES[family])), timeout=300)
    counts = {line.split()[1]: tuple(map(int, line.split()[2:])) for line in lines}
    assert counts["zoo"] == counts["hf"] == counts.get("gguf", counts["zoo"]), counts
    ran, steps, strided = counts["zoo"]
    assert strided == 0, counts  # every tensor in zoo's own row order, whatever the source
    if family in ONE_CALL:
        assert steps == 5 and ran == steps, counts  # every step after the prompt
    else:
        assert ran == 0, counts  # declined alike from every source
