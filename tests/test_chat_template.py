"""Chat templates: Hugging Face tokenizer folders load with their template, special tokens
and end ids, and conversations render exactly as ``transformers`` renders them (text and
ids), on five real models' templates (tests/data/chat_templates)."""

from __future__ import annotations

import dataclasses
import json
import queue
import re
import subprocess
import sys
import textwrap
import threading

import pytest
from chat_folders import MODELS, TEMPLATES, library_tokenizer, token_id, write_folder

import zoo
from zoo.tokenizers import ChatTemplateError, VocabularyFileError, from_pretrained

transformers = pytest.importorskip("transformers")

SYSTEM = {"role": "system", "content": "You are a terse assistant."}
USER = {"role": "user", "content": "Hello, how are you?"}
ASSISTANT = {"role": "assistant", "content": "Fine. And you?"}
USER2 = {"role": "user", "content": "Name a prime <|im_end|> [INST] and an emoji 🦀, ünïcode."}

#: Conversations without tools: one turn, a system message, several turns, an assistant last.
CONVERSATIONS = {
    "user": [USER],
    "system-user": [SYSTEM, USER],
    "multi-turn": [SYSTEM, USER, ASSISTANT, USER2],
    "multi-turn-no-system": [USER, ASSISTANT, USER2],
    "assistant-last": [USER, ASSISTANT],
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(model, jinja_file) -> (folder, zoo tokenizer, transformers tokenizer), built once."""
    made = {}

    def get(model: str, jinja_file: bool = False):
        if (model, jinja_file) not in made:
            where = tmp_path_factory.mktemp("tok") / model
            folder = write_folder(where, model, jinja_file=jinja_file)
            reference = transformers.AutoTokenizer.from_pretrained(str(folder))
            made[model, jinja_file] = folder, zoo.tokenizer(str(folder)), reference
        return made[model, jinja_file]

    return get


def _both(zoo_call, hf_call):
    """Both results, or both errors' messages (the template's raise_exception)."""
    try:
        expected = hf_call()
    except Exception as exc:  # jinja2.TemplateError from raise_exception
        with pytest.raises(ChatTemplateError) as raised:
            zoo_call()
        assert str(exc) in str(raised.value)
        return None
    return zoo_call(), expected


@pytest.mark.parametrize("generation_prompt", [True, False], ids=["gen-prompt", "no-gen-prompt"])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_renders_as_transformers(folders, model, conversation, generation_prompt):
    _, tok, reference = folders(model)
    messages = CONVERSATIONS[conversation]
    found = _both(
        lambda: tok.apply_chat_template(messages, add_generation_prompt=generation_prompt),
        lambda: reference.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False
        ),
    )
    if found is None:  # refused by the template (Mistral: roles must alternate)
        return
    text, expected = found
    assert text == expected
    assert USER["content"] in text  # a real rendering, not an empty one
    ids = tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
    expected_ids = reference.apply_chat_template(
        messages, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
    )
    assert ids == expected_ids
    assert tok.decode(ids) == text


def test_the_conversations_differ_where_they_should(folders):
    """Guards the comparison above: the generation prompt and the turns change the text."""
    _, tok, _ = folders("qwen2.5-instruct")
    with_prompt = tok.apply_chat_template([USER], add_generation_prompt=True)
    without = tok.apply_chat_template([USER], add_generation_prompt=False)
    assert with_prompt == without + "<|im_start|>assistant\n"
    assert "You are Qwen" in without  # the template's default system message
    assert tok.apply_chat_template([SYSTEM, USER]).startswith(
        "<|im_start|>system\nYou are a terse assistant.<|im_end|>\n"
    )


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_template_in_chat_template_jinja_renders_the_same(folders, model):
    """transformers 4.43+ writes the template to chat_template.jinja instead."""
    folder, tok, reference = folders(model, jinja_file=True)
    assert (folder / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    assert tok.chat_template == (TEMPLATES / f"{model}.jinja").read_text()
    messages = CONVERSATIONS["multi-turn-no-system"]
    expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(messages, add_generation_prompt=True) == expected


def test_qwen3_reasoning_and_template_variables_as_transformers(folders):
    _, tok, reference = folders("qwen3")
    thought = {"role": "assistant", "content": "Four.", "reasoning_content": "2 + 2 = 4"}
    older = {"role": "assistant", "content": "<think>\nhm\n</think>\n\nYes.", "tool_calls": None}
    messages = [USER, older, {"role": "user", "content": "2 + 2?"}, thought]
    for extra in ({}, {"enable_thinking": False}):
        for prompt in (True, False):
            expected = reference.apply_chat_template(
                messages, add_generation_prompt=prompt, tokenize=False, **extra
            )
            assert tok.apply_chat_template(messages, add_generation_prompt=prompt, **extra) == (
                expected
            )
    text = tok.apply_chat_template([USER], add_generation_prompt=True, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tools_and_documents_render_as_transformers(folders):
    _, tok, reference = folders("qwen2.5-instruct")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather in a city ü",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}],
    }
    messages = [USER, call, {"role": "tool", "content": "sunny"}]
    expected = reference.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True) == expected
    assert '"description": "The weather in a city ü"' in expected  # tojson keeps non-ASCII


def test_continue_final_message_as_transformers(folders):
    _, tok, reference = folders("qwen2.5-instruct")
    messages = [USER, {"role": "assistant", "content": "Well, I am "}]
    expected = reference.apply_chat_template(messages, continue_final_message=True, tokenize=False)
    assert tok.apply_chat_template(messages, continue_final_message=True) == expected
    assert expected.endswith("Well, I am ")
    with pytest.raises(ChatTemplateError, match="do not go together"):
        tok.apply_chat_template(messages, continue_final_message=True, add_generation_prompt=True)


def test_generation_tags_loop_controls_and_globals_as_transformers(folders):
    """What transformers' environment adds: {% generation %}, break/continue, dict(),
    namespace(), tojson's options, raise_exception."""
    _, tok, reference = folders("smollm2-instruct")
    source = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}"
        "{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% set ns.n = ns.n + 1 %}{% generation %}[{{ m.content }}]{% endgeneration %}"
        "{% endfor %}{{ ns.n }} {{ dict(a=[1, 'ü'], b=none) | tojson(indent=1) }}"
    )
    messages = CONVERSATIONS["multi-turn"]
    expected = reference.apply_chat_template(messages, chat_template=source, tokenize=False)
    assert tok.apply_chat_template(messages, chat_template=source) == expected
    assert expected.startswith("[Hello, how are you?]1 {")
    refusing = "{{ raise_exception('no ' ~ messages[0].role) }}"
    with pytest.raises(ChatTemplateError, match="refused the conversation: no system"):
        tok.apply_chat_template(messages, chat_template=refusing)
    # the template's own message is passed on cut (it went whole into an HTTP 400 body)
    flooding = "{{ raise_exception('x' * 16000000) }}"
    with pytest.raises(ChatTemplateError, match=r"x\.\.\. \(cut: 16,000,000 characters") as info:
        tok.apply_chat_template(messages, chat_template=flooding)
    assert len(str(info.value)) < 1200


def test_message_objects_and_none_values_as_transformers(folders):
    @dataclasses.dataclass
    class Message:
        role: str
        content: str | None
        tool_calls: list | None = None

    _, tok, reference = folders("qwen2.5-instruct")
    messages = [Message("user", "Hi"), Message("assistant", "Hello", None)]
    expected = reference.apply_chat_template(messages, tokenize=False)
    assert tok.apply_chat_template(messages) == expected


def test_a_folder_loads_its_special_tokens_and_end_ids(folders):
    folder, tok, reference = folders("qwen2.5-instruct")
    assert tok.name == "qwen2.5-instruct" and tok.vocab_size == len(reference)
    assert tok.roles == {"eos": "<|im_end|>", "pad": "<|endoftext|>"}
    assert tok.bos_id is None and tok.eos_id == token_id("<|im_end|>")
    assert tok.end_ids == (token_id("<|im_end|>"), token_id("<|endoftext|>"))
    assert "<|im_start|>" in tok.special_tokens and "<think>" not in tok.special_tokens
    text = "Hi <|im_start|> <think>"
    assert tok.encode(text, allowed_special="all") == reference(text)["input_ids"]
    # through its model: a checkpoint folder with those files gets that tokenizer
    assert zoo.tokenizer(folder).end_ids == tok.end_ids  # a Path works too


def test_the_added_tokens_decoder_marks_and_adds_tokens(tmp_path):
    folder = write_folder(tmp_path / "t", "qwen2.5-instruct")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    extra = token_id("</think>") + 1
    config["added_tokens_decoder"][str(extra)] = {"content": "<|new|>", "special": True}
    config["added_tokens_decoder"][str(token_id("<think>"))]["special"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = from_pretrained(folder)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert tok.special_id("<|new|>") == extra == reference.convert_tokens_to_ids("<|new|>")
    assert "<think>" in tok.special_tokens
    config["added_tokens_decoder"]["5"] = {"content": "<|im_end|>", "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(VocabularyFileError, match=r"gives '<\|im_end\|>' id 5.*at 261"):
        from_pretrained(folder)


def test_roles_from_special_tokens_map_and_added_token_dicts(tmp_path):
    folder = write_folder(tmp_path / "t", "tinyllama-chat", generation=False)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
        config.pop(key)
    config["bos_token"] = {"__type": "AddedToken", "content": "<s>", "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}))
    tok = from_pretrained(folder)
    assert tok.roles == {"bos": "<s>", "eos": "</s>"}
    assert tok.end_ids == (token_id("</s>"),)  # no generation_config.json: the eos alone
    text = tok.apply_chat_template([USER], add_generation_prompt=True)
    assert text == "<|user|>\nHello, how are you?</s>\n<|assistant|>\n"


def test_sequence_tokens_follow_the_flags_or_the_post_processor(tmp_path):
    from tokenizers import processors

    folder = write_folder(tmp_path / "flags", "tinyllama-chat")
    assert zoo.tokenizer(str(folder)).encode("Hi", add_special_tokens=True) == [257, 72, 105]
    folder = write_folder(tmp_path / "post", "tinyllama-chat")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["add_bos_token"], config["add_eos_token"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    library = library_tokenizer()
    library.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 257), ("</s>", 258)]
    )
    library.save(str(folder / "tokenizer.json"))
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = zoo.tokenizer(str(folder)).encode("Hi", add_special_tokens=True)
    assert ids == reference("Hi")["input_ids"] == [257, 72, 105, 258]


def test_named_templates_pick_as_transformers(tmp_path):
    folder = write_folder(tmp_path / "t", "smollm2-instruct", template="")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "{{ messages[0].content }}|default"},
        {"name": "tool_use", "template": "{{ messages[0].content }}|tools {{ tools|length }}"},
        {"name": "rag", "template": "{{ documents[0].text }}|rag"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok, reference = from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)
    tools, documents = [{"type": "function", "function": {"name": "f"}}], [{"text": "doc"}]
    for kwargs in ({}, {"tools": tools}, {"chat_template": "rag", "documents": documents}):
        expected = reference.apply_chat_template([USER], tokenize=False, **kwargs)
        assert tok.apply_chat_template([USER], **kwargs) == expected
    assert set(tok.chat_template) == {"default", "tool_use", "rag"}
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "short.jinja").write_text("{{ messages|length }}")
    (folder / "chat_template.jinja").write_text("jinja file")
    tok = from_pretrained(folder)  # the files win over tokenizer_config.json's templates
    assert tok.chat_template == {"default": "jinja file", "short": "{{ messages|length }}"}
    assert tok.apply_chat_template([USER], chat_template="short") == "1"


def test_a_tokenizer_without_a_template_says_what_is_missing(tmp_path):
    folder = write_folder(tmp_path / "t", "tinyllama-chat", template="")
    tok = zoo.tokenizer(str(folder))
    assert tok.chat_template is None
    with pytest.raises(ChatTemplateError, match=r"no chat_template in tokenizer_config\.json"):
        tok.apply_chat_template([USER])
    given = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert tok.apply_chat_template([USER], chat_template=given) == "<s>Hello, how are you?"
    with pytest.raises(ChatTemplateError, match="no chat template"):
        zoo.tokenizer("gpt2-124m").apply_chat_template([USER])


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ("Hi", "list of messages"),
        ([], "empty"),
        ([[USER]], "one conversation at a time"),
        ([("user", "Hi")], "one conversation at a time"),
        ([42], "must be a dict"),
    ],
)
def test_bad_conversations_are_clear_errors(folders, messages, message):
    _, tok, _ = folders("smollm2-instruct")
    with pytest.raises(ChatTemplateError, match=message):
        tok.apply_chat_template(messages)


def test_a_folder_without_tokenizer_json_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(VocabularyFileError, match=r"tokenizer\.json is missing.*it has: tok"):
        zoo.tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(VocabularyFileError, match="not a valid tokenizers file"):
        zoo.tokenizer(str(tmp_path))


def test_a_saved_model_keeps_its_chat_template_and_end_ids(tmp_path):
    """zoo.save writes the folder tokenizer's template and end ids with it; zoo.load reads
    them back. A Hugging Face checkpoint reads the tokenizer files beside its weights."""
    folder = write_folder(tmp_path / "tok", "qwen2.5-instruct")
    tok = zoo.tokenizer(str(folder))
    model = zoo.build("llama-tiny", vocab_size=tok.vocab_size)
    zoo.save(model, tmp_path / "saved", tokenizer=tok)
    back = zoo.load(tmp_path / "saved").tokenizer
    assert back.chat_template == tok.chat_template and back.end_ids == tok.end_ids
    conversation = CONVERSATIONS["multi-turn"]
    assert back.apply_chat_template(conversation) == tok.apply_chat_template(conversation)

    zoo.export(model, tmp_path / "hf")  # a Hugging Face checkpoint, then its tokenizer files
    plain = tmp_path / "plain"  # as a Hub snapshot holds them, in one plain folder
    plain.mkdir()
    for name in ("config.json", "model.safetensors"):
        (plain / name).write_bytes((tmp_path / "hf" / name).read_bytes())
    for checkpoint in (plain, tmp_path / "hf"):
        assert zoo.load(checkpoint).tokenizer is None
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            (checkpoint / name).write_bytes((folder / name).read_bytes())
        found = zoo.load(checkpoint).tokenizer
        assert found is not None and found.end_ids == tok.end_ids
        assert found.apply_chat_template(conversation) == tok.apply_chat_template(conversation)


# -- the sandbox -----------------------------------------------------------------------------
HOSTILE = {
    "class": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "subclasses": "{{ messages.__class__.__base__.__subclasses__() }}",
    "globals": "{{ raise_exception.__globals__['sys'].modules }}",
    "namespace-dunder": "{% set ns = namespace(__class__=1) %}",
    "mutation": "{% set _ = messages.append(1) %}{{ messages }}",
    "huge-range": "{% for i in range(10**9) %}{% endfor %}",
    "nested-loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    ),
    "nested-string-loops": (
        "{% for i in 'x' * 100000 %}{% for j in 'x' * 100000 %}{% endfor %}{% endfor %}"
    ),
    "huge-power": "{{ 7 ** 100000000 }}",
    "huge-string": "{{ 'x' * 10 ** 10 }}",
    "doubling": (
        "{% set ns = namespace(s='ab') %}{% for i in range(80) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}"
    ),
    "padding": "{{ 'x'.ljust(10 ** 12) }}",
    "output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
}

_CHILD = textwrap.dedent(
    """
    import json, sys
    from zoo.tokenizers import ChatTemplate, ChatTemplateError, chat_limits
    chat_limits.MAX_SECONDS = 1e9  # each refusal by a count (steps, size, depth), not the clock
    out = {}
    for name, source in json.loads(sys.argv[1]).items():
        try:
            text = ChatTemplate({"default": source}).render([{"role": "user", "content": "x"}])
            out[name] = ["rendered", text[:200]]
        except ChatTemplateError as exc:
            out[name] = ["refused", str(exc)[:300]]
    print(json.dumps(out))
    """
)


def test_hostile_templates_are_refused_by_the_sandbox():
    """Each runs in a child process with a time limit: a sandbox that let one through could
    hang or crash the interpreter. Every one must be refused by a bound that counts (steps,
    sizes, depth), never by the wall-clock MAX_SECONDS, which the child sets out of reach:
    a machine under load then changes no outcome."""
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(HOSTILE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    results = json.loads(run.stdout)
    assert set(results) == set(HOSTILE)
    for name, (outcome, detail) in results.items():
        assert outcome == "refused", f"{name} was rendered: {detail!r}"
    assert "unsafe" in results["class"][1] and "unsafe" in results["globals"][1]
    assert "1,000,000 (MAX_STEPS steps)" in results["nested-loops"][1]
    assert "1,000,000 (MAX_STEPS steps)" in results["nested-string-loops"][1]
    assert "Range too big" in results["huge-range"][1]
    assert "MAX_POWER_BITS" in results["huge-power"][1]
    assert "16,777,216 (MAX_SIZE characters)" in results["huge-string"][1]
    assert "16,777,216 (MAX_SIZE characters)" in results["doubling"][1]
    assert "output reached" in results["output"][1]


#: Templates that would hang, exhaust memory or crash the process without a bound on steps,
#: sizes (checked before a value is built), bytes or time.
HOSTILE_BUDGETS = {
    "macro-2^40": (
        "{% macro f(n) %}{% if n < 40 %}{{ f(n+1) }}{{ f(n+1) }}{% endif %}{% endmacro %}{{ f(0) }}"
    ),
    "sum-quadratic": "{{ ([['x'*1000]*10000]*10000)|sum(start=[])|length }}",
    "sum-long": "{{ ([[1]*1000]*1000)|sum(start=[])|sum(start=[[0]])|length }}",
    "center": "{{ 'x'|center(1999999999) }}",
    "join-doubling": (
        "{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
        "{% set ns.s = [ns.s, ns.s]|join %}{% endfor %}"
    ),
    "percent-width": "{{ '%01999999999d' % 1 }}",
    "format-filter-width": "{{ '%1999999999s'|format('a') }}",
    "indent": "{{ ('x\n' * 1000000)|indent(3000) }}",
    "tojson": "{{ (['x' * 1000000] * 10000)|tojson }}",
    "string": "{{ (['x' * 16000000] * 300)|string }}",
    "str-format-width": "{{ '{:>1999999999}'.format(1) }}",
    "filter-block": "{% filter center(1999999999) %}x{% endfilter %}",
    "join-method-lazy": "{{ ('x' * 16000000).join(range(100000)|map('string')) }}",
    "join-filter-lazy": "{{ range(100000)|map('string')|join('x' * 16000000) }}",
    "title": "{{ ('a ' * 8000000)|title }}",
    "striptags": "{{ ('a ' * 8000000)|striptags }}",
    "urlencode": "{{ ('%' * 16000000)|urlencode }}",
    "list-growth": (
        "{% set ns = namespace(a=[]) %}{% for i in range(100000) %}{% set ns.a = ns.a + [i] %}"
        "{% endfor %}"
    ),
    "fields": "{{ '{0}{0}{0}{0}'.format('x' * 5000000) }}",
    "fill-batch": "{% set x = 'x' * 100000 %}{{ [x]|batch(1000, x)|list }}",
    "attr-format": "{{ ('{:>1999999999}'|attr('format'))(1) }}",
    "tojson-indent": "{{ [1, [2]]|tojson(indent=1999999999) }}",
    "tojson-separators": "{{ (range(100000)|list)|tojson(separators=(',' * 1000, ':')) }}",
    "macro-recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "nested-macros": (
        "{% macro b() %}{% for i in range(1000) %}{{ i }}{% endfor %}{% endmacro %}"
        "{% macro a() %}{% for i in range(1000) %}{{ b() }}{% endfor %}{% endmacro %}{{ a() }}"
    ),
    "string-times": "{{ 'ab' * 9000000 }}",
    "concat-tilde": "{{ ('x' * 9000000) ~ ('y' * 9000000) }}",
    "namespace-dict": (
        "{% set ns = namespace(d={}) %}{% for i in range(100000) %}"
        "{% set ns.d = dict(ns.d, **{('k' ~ i): 'v' * 100000}) %}{% endfor %}"
    ),
    "list-doubling": (
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
        "{% endfor %}"
    ),
    "shared-list-compare": (
        "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(64) %}"
        "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
        "{{ ns.a == ns.b }}"
    ),
    "shared-tuple-hash": (
        "{% set ns = namespace(t=(1,)) %}{% for i in range(64) %}{% set ns.t = (ns.t, ns.t) %}"
        "{% endfor %}{{ {ns.t: 1} }}"
    ),
    "deep-nesting": (
        "{% set ns = namespace(l=[]) %}{% for i in range(10000) %}{% set ns.l = [ns.l] %}"
        "{% endfor %}{{ ns.l }}"
    ),
    "namespace-cycle": "{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}",
    "replace-filter": "{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}",
    "replace-method": "{{ ('x' * 4000).replace('', 'y' * 10000) }}",
    "wordwrap": "{{ ('x ' * 100000)|wordwrap(1, wrapstring='y' * 1000) }}",
    "percent-precision": "{{ '%.1999999999f' % 1.0 }}",
    "percent-star": "{{ '%*d' % (1999999999, 1) }}",
    "str-format-fill": "{{ '{:0>1999999999}'.format(1) }}",
    "str-format-nested": "{{ '{:{}}'.format(1, 1999999999) }}",
    "str-format-map": "{{ '{a:>1999999999}'.format_map({'a': 1}) }}",
    "list-times": "{{ [1] * 10**9 }}",
    "list-of-lists-times": "{{ [[1] * 1000000] * 1000 }}",
    "batch-fill": "{{ [1]|batch(1999999999, 0)|list }}",
    "slice": "{{ [1]|slice(1999999999)|list }}",
    "batch-each": "{{ ('x' * 16000000)|batch(1)|list|length }}",
    "unique": "{{ ('x' * 16000000)|unique|list }}",
    "sort": "{{ (range(100000)|list * 20)|sort|length }}",
    "map-select": "{{ ('x' * 16000000)|map('upper')|select|list|length }}",
    "map-chain": (
        "{% for i in range(1000) %}{{ range(100000)|map('string')|map('center', 100)|join }}"
        "{% endfor %}"
    ),
    "loop-cycle": ("{% for i in range(100000) %}{{ loop.cycle('a' * 10000, 'b') }}{% endfor %}"),
    "recursive-loop": "{% for x in range(100000) recursive %}{{ loop(range(100000)) }}{% endfor %}",
    "pprint": (
        "{% set ns = namespace(l=[1]) %}{% for i in range(30) %}{% set ns.l = [ns.l, ns.l] %}"
        "{% endfor %}{{ ns.l|pprint }}"
    ),
    "lipsum": "{{ lipsum(1999999999) }}",
    "strftime-width": "{{ strftime_now('%1999999999Y') }}",
    "expandtabs": "{{ ('\t' * 1000000).expandtabs(1000) }}",
    "split": "{{ (',' * 16000000).split(',')|length }}",
    "ljust": "{{ 'x'.ljust(16000000) ~ 'x'.ljust(16000000) }}",
    "translate": "{{ ('x' * 1000000).translate({120: 'y' * 1000}) }}",
    "kept-by-frames": (
        "{% macro f(n) %}{% set s = 'x' * 16000000 ~ n %}{% if n < 100 %}{{ f(n + 1) }}"
        "{% endif %}{% endmacro %}{{ f(0) }}"
    ),
    "macro-output": (
        "{% macro f() %}{% for i in range(20000) %}{{ 'x' * 1000 }}{% endfor %}{% endmacro %}"
        "{{ f()|length }}"
    ),
    "set-block": "{% set s %}{% for i in range(20000) %}{{ 'x' * 1000 }}{% endfor %}{% endset %}",
    "int-product": (
        "{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}"
        "{% endfor %}"
    ),
    "slices": (
        "{% set ns = namespace(l=[]) %}{% set s = 'x' * 16000000 %}{% for i in range(100) %}"
        "{% set ns.l = ns.l + [s[i:]] %}{% endfor %}"
    ),
}

#: Runs each template of a corpus in this child, under a 1 GiB address-space cap, with the
#: step and time budgets cut to 10,000 steps and 0.5 s (so that the step-bound cases are cheap;
#: the size and byte budgets are the real ones). One line per template, as it ends: its
#: outcome, seconds, and the child's peak memory above its start so far (MB).
_BUDGET_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from zoo.tokenizers import ChatTemplate, ChatTemplateError, chat_limits
    chat_limits.MAX_STEPS, chat_limits.MAX_SECONDS = 10_000, 0.5
    ChatTemplate({"default": "{{ 1 }}"}).render([{"role": "user", "content": "x"}])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB, once warmed up
    print(json.dumps(["ready"]), flush=True)
    for name, source in json.loads(sys.argv[1]).items():
        start = time.perf_counter()
        try:
            ChatTemplate({"default": source}).render([{"role": "user", "content": "x"}])
            outcome = "rendered"
        except ChatTemplateError as exc:
            outcome = "refused: " + str(exc)
        except BaseException as exc:  # MemoryError, RecursionError: what must not escape
            outcome = f"{type(exc).__name__}: {exc}"
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        print(json.dumps([name, outcome[:300], time.perf_counter() - start, peak]), flush=True)
    """
)


def _outcomes(child: str, corpus: dict[str, str], timeout: float) -> dict[str, list]:
    """Each template's [outcome, seconds, peak MB] from ``child``, run on ``corpus``; a
    template that does not end within ``timeout`` seconds (or a child that dies) ends the run,
    leaving it and the rest out. The child's start (Python, zoo, a warm-up render: seconds on
    a loaded machine) is not counted: the clock starts at its ``["ready"]`` line."""
    process = subprocess.Popen(
        [sys.executable, "-c", child, json.dumps(corpus)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in process.stdout:
            lines.put(line)
        lines.put("")  # the end: no more outcomes

    reader = threading.Thread(target=read)
    reader.start()
    outcomes = {}
    try:
        assert json.loads(lines.get(timeout=300)) == ["ready"], "the child did not start"
        for _ in corpus:
            name, *outcome = json.loads(lines.get(timeout=timeout))
            outcomes[name] = outcome
    except (queue.Empty, json.JSONDecodeError):  # hung, or died (EOF gives no line)
        pass
    finally:
        process.kill()
        process.wait()
        reader.join()
    return outcomes


def test_hostile_templates_end_in_a_chat_template_error_within_the_budgets():
    """Every template of the corpus ends in a ChatTemplateError that names the
    budget it broke, each within 10 s (in practice well under 1 s), under 1 GiB of address
    space: no hang, no MemoryError, no dead process."""
    results = _outcomes(_BUDGET_CHILD, HOSTILE_BUDGETS, timeout=10)
    missing = [name for name in HOSTILE_BUDGETS if name not in results]
    assert not missing, f"the child hung or died before ending {missing}"
    budgets = ("MAX_STEPS", "MAX_SECONDS", "MAX_SIZE", "MAX_ITEMS", "MAX_ALLOCATED",
               "MAX_DEPTH", "MAX_CALL_DEPTH", "MAX_POWER_BITS")  # fmt: skip
    for name, (outcome, _, _) in results.items():
        assert outcome.startswith("refused: "), f"{name}: {outcome}"
        assert any(budget in outcome for budget in budgets), f"{name}: {outcome}"


#: A method, filter, operator or format whose result was once sized only after
#: it was built (``int.to_bytes`` with no bound at all: 4 GiB), each with what its refusal
#: must say: that the size was computed before the value was built (the estimate's own
#: message, not the check of a built value's size) and the limit it broke.
HOSTILE_SIZED = {
    "to-bytes": ("{{ (1).to_bytes(4294967296, 'big')|length }}", "to_bytes() would build"),
    "to-bytes-keywords": (
        "{{ (1).to_bytes(length=17000000, byteorder='little')|length }}",
        "to_bytes() would build",
    ),
    "upper-method": ("{{ ('\ufb03' * 6000000).upper() }}", "upper() would build"),
    "upper-filter": ("{{ ('\ufb03' * 6000000)|upper }}", "the upper filter would write"),
    "capitalize-filter": (
        "{{ ('\u0130' * 9000000)|capitalize }}",
        "the capitalize filter would write",
    ),
    "casefold": ("{{ ('\u00df' * 9000000).casefold() }}", "casefold() would build"),
    "lower-filter": ("{{ ('\u0130' * 9000000)|lower }}", "the lower filter would write"),
    "encode-utf8": (
        "{{ ('\U0010ffff' * 5000000).encode('utf-8')|length }}",
        "encode() would build",
    ),
    "encode-namereplace": (
        "{{ ('\u00e9' * 1000000).encode('ascii', 'namereplace')|length }}",
        "encode() would build",
    ),
    "hex": ("{{ ('x' * 9000000).encode().hex()|length }}", "hex() would build"),
    "hex-separator": ("{{ ('x' * 6000000).encode().hex(':')|length }}", "hex() would build"),
    "decode-backslashreplace": (
        "{{ ('\u00ff' * 5000000).encode('latin-1').decode('ascii', 'backslashreplace')|length }}",
        "decode() would build",
    ),
    "translate-list": (
        "{{ ('\x00' * 1000).translate(['y' * 100000])|length }}",
        "translate() would build",
    ),
    "split-text": ("{{ ('xxxxxxxxxxxxx,' * 1000000).split(',')|length }}", "split() would build"),
    "repr-percent": ("{{ ('%r' % ('\x00' * 5000000))|length }}", "a % format would write"),
    "repr-format": (
        "{{ '{!r}'.format('\x00' * 5000000)|length }}",
        "a format would write a field of",
    ),
    "repr-in-list": ("{{ ['\x00' * 5000000] }}", "would build a value whose text is"),
    "tojson-controls": ("{{ ('\x00' * 5000000)|tojson|length }}", "tojson would write"),
    "tojson-ensure-ascii": (
        "{{ ('\U0001f600' * 2000000)|tojson(ensure_ascii=true)|length }}",
        "tojson would write",
    ),
    "markup-add": ("{{ (('x'|safe) + ('<' * 5000000))|length }}", "+ would build"),
    "markup-percent": ("{{ (('%s'|safe) % ('<' * 5000000))|length }}", "% format would write"),
    "markup-format": ("{{ ('{}'|safe).format('<' * 5000000)|length }}", "a format would write"),
    "format-filter-markup": (
        "{{ ('%s'|safe)|format('<' * 5000000)|length }}",
        "the format filter would write",
    ),
    "encode-counted": ("{{ ('\u00e9' * 9000000).encode()|length }}", "encode() would build"),
    "decode-counted": (
        "{{ ('\u00ff' * 5000000).encode('latin-1').decode('utf-8', 'backslashreplace')|length }}",
        "decode() would build",
    ),
    "markup-join": ("{{ ('x'|safe).join(['<' * 5000000])|length }}", "join() would build"),
    "markup-replace": (
        "{{ ('x'|safe).replace('x', '<' * 5000000)|length }}",
        "replace() would escape an argument of",
    ),
}


def test_every_value_is_sized_before_it_is_built():
    """Each template is refused by the estimate made before its value is
    built (the estimate's message, naming the limit), under 1 GiB of address space, and the
    child's peak memory stays within its inputs (a few tens of MB), where ``to_bytes`` built
    4 GiB (a MemoryError under the cap) and ``upper`` 48 M characters (282 MB) before."""
    corpus = {name: source for name, (source, _) in HOSTILE_SIZED.items()}
    results = _outcomes(_BUDGET_CHILD, corpus, timeout=10)
    missing = [name for name in corpus if name not in results]
    assert not missing, f"the child hung or died before ending {missing}"
    for name, (outcome, _, _) in results.items():
        expected = HOSTILE_SIZED[name][1]
        assert outcome.startswith("refused: "), f"{name}: {outcome}"
        assert expected in outcome and "(MAX_SIZE characters)" in outcome, f"{name}: {outcome}"
    assert max(peak for _, _, peak in results.values()) < 200, results


def test_a_method_not_known_to_be_sized_is_refused_by_name():
    """An allowlist: a method of a value whose result is not sized before it runs is refused,
    naming it, rather than left to a list of known bad ones."""
    from zoo.tokenizers import ChatTemplate

    for source, method in (
        ("{{ (range(3)|map('string')).send(none) }}", "generator.send"),
        ("{{ {'a': 1}.items().mapping.copy() }}", "mappingproxy.copy"),
        ("{{ 'x'.encode('punycode') }}", "'punycode'"),
    ):
        with pytest.raises(ChatTemplateError, match=re.escape(method)):
            ChatTemplate({"default": source}).render([USER])


def test_a_long_string_whose_result_fits_is_counted_not_refused():
    """A bound of 3 characters (or 4 bytes) for one is over the limit for these strings; their
    results are counted a chunk at a time, fit, and render as Python writes them."""
    from zoo.tokenizers import ChatTemplate

    for source, expected in (
        ("{{ ('\u00e9' * 6000000).upper()|length }}", "6000000"),
        ("{{ ('\u00e9' * 6000000)|upper|length }}", "6000000"),
        ("{{ ('\u00e9' * 6000000).encode()|length }}", "12000000"),
        (
            "{{ ('\u00e9' * 5000000).encode().decode('utf-8', 'backslashreplace')|length }}",
            "5000000",
        ),
    ):
        assert ChatTemplate({"default": source}).render([USER]) == expected, source


def test_integers_stay_within_max_power_bits():
    """An integer that ``+``, ``-`` or ``int.from_bytes`` would build past MAX_POWER_BITS is
    refused (with ``//`` or ``%``, a huge one costs time quadratic in its length)."""
    from zoo.tokenizers import ChatTemplate

    doubling = (
        "{% set ns = namespace(n=1) %}{% for i in range(5000) %}{% set ns.n = ns.n + ns.n %}"
        "{% endfor %}{{ ns.n > 0 }}"
    )
    for source in (doubling, "{{ (1).from_bytes(('x' * 1000).encode(), 'big') > 0 }}"):
        with pytest.raises(ChatTemplateError, match=r"4,096 \(MAX_POWER_BITS\)"):
            ChatTemplate({"default": source}).render([USER])
    small = "{{ (1).from_bytes('ab'.encode(), 'big') + 2 ** 2000 - 2 ** 2000 }}"
    assert ChatTemplate({"default": small}).render([USER]) == "24930"


def test_the_limits_leave_ordinary_templates_alone():
    """A loop of 10,000 messages and a 1 MB message render, limits or not."""
    from zoo.tokenizers import ChatTemplate

    template = ChatTemplate({"default": (TEMPLATES / "smollm2-instruct.jinja").read_text()})
    many = [{"role": "user", "content": str(i)} for i in range(10_000)]
    assert template.render(many).count("<|im_start|>user") == 10_000
    big = template.render([{"role": "user", "content": "y" * 1_000_000}])
    assert len(big) > 1_000_000


def test_the_step_budget_counts_iterations_calls_filters_and_operators_exactly():
    """Every pass through a for loop's body, call, filter, test and operator counts one
    step, nested loops and all, whatever the body holds (an if, a loop filter); one step
    over the budget is refused."""
    from zoo.tokenizers import ChatTemplate
    from zoo.tokenizers.chat import MAX_STEPS

    def loops(last: int) -> ChatTemplate:
        body = "{% if j %}{% endif %}{% if not j %}{% endif %}"
        source = (
            "{% set inner = range(998)|list %}"  # 2 steps: a call, a filter
            "{% for i in range(1000) if i >= 0 %}{% for j in inner %}"  # 1 + 1,000 + 998,000
            f"{body}{{% endfor %}}{{% endfor %}}"
            f"{{% for k in range({last}) %}}{{% endfor %}}"  # 1 + last
            "{% if 'a' is string and 1 + 1 == 2 %}done{% endif %}"  # a test, an operator
        )
        return ChatTemplate({"default": source})

    assert MAX_STEPS == 2 + 1 + 1000 + 998 * 1000 + 1 + 994 + 2
    assert loops(994).render([USER]) == "done"
    with pytest.raises(ChatTemplateError, match=r"1,000,000 \(MAX_STEPS steps\)"):
        loops(995).render([USER])


#: Ordinary uses of what the budgets hook (operators, formats, filters, methods, macros,
#: literals), each rendered as a plain Jinja sandbox renders it.
ORDINARY = (
    "{{ 1 + 2 }} {{ 7 - 10 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 3 * 4 }}",
    "{{ 'ab' * 3 }} {{ [1, 2] * 2 }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ 'a' ~ 1 ~ none }}",
    "{{ '%5.2f|%-4s|%03d|%x|%r|%%' % (3.14159, 'a', 7, 255, 'q') }} {{ '%(a)s' % {'a': 1} }}",
    "{{ '{:>6}|{:^7.3f}|{!r}|{a[0]}|{:,}'.format('x', 2.5, 'y', 1234567, a=[9]) }}",
    "{{ '{x}'.format_map({'x': 1}) }} {{ '%s and %s'|format('a', 'b') }}",
    "{{ 'x'|center(9) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'abc'|replace('b', 'BB') }}",
    "{{ [1, 2, 3]|join(', ') }} {{ 'abc'|join('-') }} {{ [[1], [2, 3]]|sum(start=[]) }}",
    "{{ [1, 2]|sum }} {{ [(1,), (2,)]|sum(start=()) }} {{ 'a b  c'|wordcount }}",
    "{{ {'b': [1, 'ü'], 'a': none}|tojson }} {{ [1, {'a': 2}]|tojson(indent=2) }}",
    "{{ {'a': 1}|tojson(separators=(',', ':'), sort_keys=true) }} {{ [1, [2]]|pprint }}",
    "{{ 'some words to wrap here'|wordwrap(10) }} {{ 'x'|urlize }} {{ 'a<b'|e }}",
    "{{ [3, 1, 2]|sort|list }} {{ [1, 1, 2]|unique|list }} {{ [1, 2, 3, 4, 5]|batch(2)|list }}",
    "{{ [1, 2, 3]|slice(2)|list }} {{ ['a', 'b']|map('upper')|list }} {{ [0, 1]|select|list }}",
    "{{ 'a,b'.split(',') }} {{ 'x'.ljust(3) }}| {{ 'a\tb'.expandtabs(4) }} {{ '-'.join('ab') }}",
    "{{ 'abc'.translate({97: 'A'}) }} {{ 'a\nb'.splitlines() }} {{ 'abc'[::-1] }} {{ [1, 2][1:] }}",
    "{% macro f(n) %}{{ n }}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
    "{% set ns = namespace(s='') %}{% for i in range(3) %}{% set ns.s = ns.s ~ i %}{% endfor %}"
    "{{ ns.s }} {{ {'a': (1, [2])} }} {{ dict(a=1) }} {{ [none, true, 1.5] }}",
    "{% set b %}block{% endset %}{{ b }}{% filter upper %}up{% endfilter %}"
    "{% for x in [[1, [2]]] recursive %}{{ x }}{% endfor %}{{ range(3)|list }}",
    # the methods of every type a template reaches, each sized before it runs
    "{{ '\ufb03 \u0130 \u00df'.upper() }} {{ '\u0130X'.lower() }} {{ '\u00dfa'.casefold() }} "
    "{{ '\ufb03 ab'.title() }} {{ 'aB\u00df'.swapcase() }} {{ '\ufb03x'.capitalize() }} "
    "{{ '\ufb03'|upper }} {{ '\u0130'|lower }} {{ '\ufb03 x'|title }} {{ '\ufb03'|capitalize }}",
    "{{ (258).to_bytes(2, 'big')|list }} {{ (1).to_bytes(length=2, byteorder='little')|list }} "
    "{{ (1).from_bytes('ab'.encode(), 'big') }} {{ (255).bit_length() }} {{ (6).bit_count() }} "
    "{{ (1.5).hex() }} {{ (0.5).as_integer_ratio() }} {{ (2.0).is_integer() }}",
    "{{ '\u00e9\U0001f600'.encode('utf-8')|list }} {{ 'x\u00e9'.encode('ascii', 'replace') }} "
    "{{ '\u00e9'.encode('ascii', 'xmlcharrefreplace') }} {{ 'ab'.encode('utf-16')|length }} "
    "{{ '\u00ff'.encode('latin-1').decode('ascii', 'backslashreplace') }} "
    "{{ 'ab'.encode().hex() }} {{ 'ab'.encode().hex(':') }} {{ 'ab'.encode().upper() }}",
    "{{ 'a-b-c'.partition('-') }} {{ 'a b'.rsplit(none, 1) }} {{ 'x'.zfill(4) }} "
    "{{ 'x'.rjust(3, '.') }} {{ 'abc'.translate(['A', 'B']) }} {{ 'ab'.maketrans('a', 'b') }} "
    "{{ 'a\tb'.encode().expandtabs(2) }} {{ 'xay'.removeprefix('x').removesuffix('y') }}",
    "{{ {}.fromkeys('ab', 0) }} {{ {'a': 1}.items()|list }} {{ {'a': 1}.get('b', 2) }} "
    "{{ {'a': 1}.copy() }} {{ [1, 2].index(2) }} {{ (1, 1).count(1) }} {{ range(5).index(3) }} "
    "{{ {'a': 1}.keys().isdisjoint(['b']) }} {{ dict.fromkeys([1, 2]) }} {{ dict([(1, 2)], a=3) }}",
    "{{ ['a\n\x00\u00e9\u200d', 'x'.encode()] }} {{ '%r|%a' % ('\x00\u00e9', '\u00e9') }} "
    "{{ '{!r}{!a}'.format('\n', '\U0001f600') }} {{ ['\U0001f600']|tojson(ensure_ascii=true) }} "
    "{{ ('<'|safe) + '<' }} {{ ('%s'|safe) % '<' }} {{ ('-'|safe).join(['<', 'a']) }} "
    "{{ ('a'|safe).replace('a', '<') }} {{ [1] * 3 + [2] }} {{ ('<<'|safe).split('<') }} "
    "{{ ('a&lt;b'|safe).replace('<', '>') }} {{ ('a'|safe).partition('<') }}",
)


def test_the_budgets_leave_ordinary_renderings_exactly_as_jinja_renders_them():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from zoo.tokenizers import ChatTemplate
    from zoo.tokenizers.chat_operations import tojson

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    plain.filters["tojson"] = tojson
    for source in ORDINARY:
        expected = plain.from_string(source).render(messages=[USER])
        assert ChatTemplate({"default": source}).render([USER]) == expected, source


def test_a_template_past_its_bytes_or_deadline_or_failing_is_a_chat_template_error(monkeypatch):
    from zoo.tokenizers import ChatTemplate, chat_limits

    with pytest.raises(ChatTemplateError, match="division by zero"):
        ChatTemplate({"default": "{{ 1 / 0 }}"}).render([USER])
    for deep in ("(" * 5000 + "1" + ")" * 5000, "[" * 5000 + "]" * 5000):  # the parser's stack
        with pytest.raises(ChatTemplateError, match=r"could not be compiled \(RecursionError\)"):
            ChatTemplate({"default": "{{ " + deep + " }}"}).render([USER])
    kept = (  # each macro frame keeps 200,000 characters alive
        "{% macro f(n) %}{% set s = 'x' * 200000 ~ n %}{% if n < 20 %}{{ f(n + 1) }}{% endif %}"
        "{% endmacro %}{{ f(0) }}"
    )
    assert ChatTemplate({"default": kept}).render([USER]) == ""
    monkeypatch.setattr(chat_limits, "MAX_ALLOCATED", 2_000_000)
    with pytest.raises(ChatTemplateError, match=r"2,000,000 \(MAX_ALLOCATED bytes\)"):
        ChatTemplate({"default": kept}).render([USER])
    monkeypatch.setattr(chat_limits, "MAX_SECONDS", -1.0)  # a deadline already past
    with pytest.raises(ChatTemplateError, match=r"more than -1 seconds \(MAX_SECONDS\)"):
        ChatTemplate({"default": "{{ 1 + 1 }}"}).render([USER])


def test_a_template_too_long_or_too_large_to_compile_is_refused_before_it_compiles():
    """Compiling is bounded too: a 1 MB template of dense statements took 12 s and 500 MB."""
    from zoo.tokenizers import ChatTemplate

    long = "x" * (1 << 18) + "x"
    with pytest.raises(ChatTemplateError, match=r"262,145, above .* \(MAX_SOURCE characters\)"):
        ChatTemplate({"default": long}).render([USER])
    with pytest.raises(ChatTemplateError, match=r"more than 20,000 syntax nodes \(MAX_NODES\)"):
        ChatTemplate({"default": "{{x}}" * 21_000}).render([USER])
    assert ChatTemplate({"default": "{{x}}" * 100}).render([USER]) == ""


def test_a_template_that_is_not_jinja_is_a_clear_error():
    from zoo.tokenizers import ChatTemplate

    with pytest.raises(ChatTemplateError, match=r"not valid Jinja \(line 1"):
        ChatTemplate({"default": "{% for m in messages %}"}).render([USER])
    undefined = ChatTemplate({"default": "{{ messages[0].content.nope() }}"})
    with pytest.raises(ChatTemplateError, match="refused the conversation"):
        undefined.render([USER])


def test_importing_the_tokenizers_imports_no_jinja():
    code = "import sys, zoo.tokenizers, zoo; assert 'jinja2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_vendored_templates_match_their_recorded_hashes():
    import hashlib

    readme = (TEMPLATES / "README.md").read_text()
    for path in sorted(TEMPLATES.glob("*.jinja")):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"`{path.name}`" in readme and digest in readme, path.name
    assert len(list(TEMPLATES.glob("*.jinja"))) == len(MODELS)


def test_a_name_that_is_no_folder_is_still_an_unknown_name(tmp_path):
    with pytest.raises(zoo.errors.UnknownModelError, match="Registered tokenizers"):
        zoo.tokenizer(str(tmp_path / "no-such-folder"))
