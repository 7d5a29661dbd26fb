#!/usr/bin/env python3
"""Render the real chat templates under tests/fixtures/chat_templates/ with jinja2, set up as HF
transformers' apply_chat_template sets it up, and write tests/fixtures/chat_templates/reference.json:
each template's text and, for every conversation, the text jinja renders or the error it raises.
test_chat_template.cpp demands that infer::ChatTemplate render the same bytes.

The environment, as transformers' chat_template_utils builds it: ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loopcontrols extension; globals raise_exception (raises
TemplateError) and strftime_now; the `tojson` filter replaced by json.dumps(x, ensure_ascii=False,
indent=..., separators=..., sort_keys=...) (Jinja's own escapes HTML characters); the template variables
messages, add_generation_prompt, tools=None, documents=None and the tokenizer's special tokens
(bos_token/eos_token: <|begin_of_text|>/<|eot_id|> for Llama-3, <s>/</s> for Mistral).

strftime_now would write today's date (Llama-3.2's template calls it, as HF defines it): here it reads a
fixed clock, recorded per template as "strftime_now", so the file does not change from day to day.
A case may also pass date_string, as a caller of apply_chat_template can.

Needs jinja2 >= 3.1 only. With --check-transformers it also renders every case through transformers'
own PreTrainedTokenizerFast.apply_chat_template (tokenizer built from tests/fixtures/smollm2/tokenizer.json
with the special tokens above; its strftime_now clock pinned the same way) and fails unless both give the
same bytes or the same error: checked with transformers 5.25.0 and jinja2 3.1.6, all cases identical.

Usage: python3 scripts/make_chat_references.py [--check-transformers]
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "chat_templates")

LLAMA = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>"}
# The day strftime_now reports: fixed, so that the reference does not depend on when it was made.
CLOCK = datetime.datetime(2024, 9, 5, 14, 30)

# name -> (file, special tokens, source); README.md in the same folder says more about each source.
TEMPLATES = {
    "llama-3": ("llama-3-8b-instruct.jinja", LLAMA, "meta-llama/Meta-Llama-3-8B-Instruct"),
    "llama-3.1": ("llama-3.1-8b-instruct.jinja", LLAMA, "meta-llama/Llama-3.1-8B-Instruct (= Llama-3.3-70B-Instruct)"),
    "llama-3.2": ("llama-3.2-3b-instruct.jinja", LLAMA, "meta-llama/Llama-3.2-3B-Instruct"),
    "mistral-v3": ("mistral-v3.jinja", MISTRAL, "Mistral v3 (Mistral-7B-Instruct-v0.3, Mixtral-8x22B, Mistral-Large-2407)"),
}


def msg(role, content):
    return {"role": role, "content": content}


# Conversations every template gets, each with add_generation_prompt true and false.
COMMON = {
    "user": [msg("user", "What is the capital of France?")],
    "system_user": [msg("system", "You are terse."), msg("user", "Hi")],
    "multi_turn": [msg("system", "You are a helpful assistant"), msg("user", "Hello"), msg("assistant", "Hi there"),
                   msg("user", "Who are you"), msg("assistant", "   I am an assistant   "),
                   msg("user", "Another question")],
    "no_system_multi_turn": [msg("user", "Hi"), msg("assistant", "Hello"), msg("user", "Bye")],
    "ends_with_assistant": [msg("user", "2+2?"), msg("assistant", "4")],
    "system_ends_with_assistant": [msg("system", "Be brief."), msg("user", "2+2?"), msg("assistant", " 4\n")],
    # What `trim` (Python's str.strip()) removes: ASCII whitespace and also Unicode spaces, line
    # separators and the ASCII information separators; not U+200B (zero width space) nor U+FEFF.
    "ascii_whitespace": [msg("system", "\n  Be kind.\t "), msg("user", "  Hi there \n"),
                         msg("assistant", "\n\nHello!  \r\n"), msg("user", "\t\n")],
    "unicode_whitespace": [msg("system", "\u3000Sys\u00a0"), msg("user", "\u2003 caf\u00e9 \u2028"),
                           msg("assistant", "\u00a0 \u041e\u0442\u0432\u0435\u0442\u3000 \x1c\x85"),
                           msg("user", "\u200b zero width is not space\ufeff")],
    "unicode": [msg("user", "日本語で答えて 👋"), msg("assistant", "はい、どうぞ。🙂"),
                msg("user", "Ünïcödé — “quotes” ‘and’ \\ backslash \"double\"")],
    "empty_content": [msg("user", "Hi"), msg("assistant", ""), msg("user", "")],
    "empty_system": [msg("system", ""), msg("user", "Hi")],
    "system_only": [msg("system", "You are terse.")],
    "system_late": [msg("user", "a"), msg("system", "b")],
    "two_systems": [msg("system", "s1"), msg("system", "s2"), msg("user", "u")],
    "user_user": [msg("user", "a"), msg("user", "b")],
    "starts_with_assistant": [msg("assistant", "a")],
    "unknown_role": [msg("user", "a"), msg("wizard", "b")],
}
# No empty conversation: apply_chat_template refuses one before any template sees it (as infer does).

# Tool results: Llama-3.1's template writes them under an ipython header through tojson.
TOOL = {
    "ipython": [msg("system", "You can call tools."), msg("user", "Weather in Paris?"),
                msg("ipython", '{"temp": 21, "unit": "C"}\n'), msg("assistant", "21 °C.")],
    "tool_result_escapes": [msg("user", "Run it"),
                            msg("tool", '  "quoted" \\ back\\slash\nnew\tline \r\b\f \x01\x1f\x7f é \u2028 👋 '),
                            msg("user", "Thanks")],
}

CASES = {
    "llama-3": {**COMMON, **TOOL},
    "llama-3.1": {**COMMON, **TOOL, "date_string": [msg("user", "Hi")]},
    "llama-3.2": {**COMMON, **TOOL, "date_string": [msg("user", "Hi")]},
    "mistral-v3": {**COMMON, **TOOL},
}
# Cases that pass apply_chat_template's date_string (a template variable the Llama-3.1 templates read).
DATE_STRING = {"date_string": "01 Jan 2030"}


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: CLOCK.strftime(fmt)
    return env


def render(template, messages, gen, special, extra):
    try:
        return {"text": template.render(messages=messages, add_generation_prompt=gen, tools=None, documents=None,
                                        **special, **extra)}
    except jinja2.exceptions.TemplateError as e:  # raise_exception, and UndefinedError for a missing messages[0]
        return {"error": f"{type(e).__name__}: {e}"}


def check_transformers(doc):
    """Renders every case with transformers' apply_chat_template; exits non-zero on any difference."""
    import transformers
    import transformers.utils.chat_template_utils as ctu
    from transformers import PreTrainedTokenizerFast

    class FixedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return CLOCK

    ctu.datetime = FixedClock  # the module's strftime_now reads datetime.now()
    tok_file = os.path.join(root, "..", "smollm2", "tokenizer.json")
    bad = 0
    for name, t in doc["templates"].items():
        tok = PreTrainedTokenizerFast(tokenizer_file=tok_file, **t["special_tokens"])
        for c in (c for c in doc["cases"] if c["template"] == name):
            extra = {"date_string": c["date_string"]} if "date_string" in c else {}
            try:
                got = {"text": tok.apply_chat_template(c["messages"], chat_template=t["text"], tokenize=False,
                                                       add_generation_prompt=c["add_generation_prompt"], **extra)}
            except jinja2.exceptions.TemplateError as e:
                got = {"error": f"{type(e).__name__}: {e}"}
            want = {k: c[k] for k in ("text", "error") if k in c}
            if got != want:
                bad += 1
                print(f"DIFFERENT {name}/{c['id']} gen={c['add_generation_prompt']}:\n  jinja2: {want!r}\n"
                      f"  transformers: {got!r}", file=sys.stderr)
    total = len(doc["cases"])
    print(f"transformers {transformers.__version__}: {total - bad} of {total} cases identical")
    if bad:
        sys.exit(1)


def main():
    env = environment()
    doc = {
        "source": f"scripts/make_chat_references.py: jinja2 {jinja2.__version__} set up as HF transformers' "
                  "apply_chat_template",
        "templates": {},
        "cases": [],
    }
    for name, (fname, special, source) in TEMPLATES.items():
        with open(os.path.join(root, fname), encoding="utf-8", newline="") as f:
            text = f.read()
        entry = {"file": fname, "source": source, "special_tokens": special, "text": text}
        if "strftime_now" in text:
            entry["strftime_now"] = {"clock": CLOCK.isoformat(), "format": "%d %b %Y",
                                     "date": CLOCK.strftime("%d %b %Y")}
            assert 'strftime_now("%d %b %Y")' in text, "the recorded format is the one the template uses"
        doc["templates"][name] = entry
        template = env.from_string(text)
        for case_id, messages in CASES[name].items():
            extra = DATE_STRING if case_id == "date_string" else {}
            for gen in (True, False):
                c = {"template": name, "id": case_id, "messages": messages, "add_generation_prompt": gen, **extra}
                c.update(render(template, messages, gen, special, extra))
                doc["cases"].append(c)

    path = os.path.join(root, "reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(path), f"({len(doc['cases'])} cases)")
    if "--check-transformers" in sys.argv:
        check_transformers(doc)


if __name__ == "__main__":
    main()
