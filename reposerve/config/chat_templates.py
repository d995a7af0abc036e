"""Chat templates: Jinja, as Hugging Face tokenizers write them (``tokenizer_config.json``'s
``chat_template``), rendered in a sandbox with what those templates expect (``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools``, ``raise_exception``).
No tokenizer library: the template alone turns messages into the prompt."""

from __future__ import annotations

import functools
import json
from typing import Any

import jinja2
import msgspec
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    """A template that does not compile, or refused (``raise_exception``) to render."""


class ChatTemplate(msgspec.Struct, frozen=True):
    source: str
    bos_token: str = ""
    eos_token: str = ""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **options: Any) -> str:
    # Hugging Face's own filter, spaced as json.dumps spaces it: the prompt a model was
    # trained on (jinja's tojson escapes HTML characters instead)
    return json.dumps(value, ensure_ascii=False, indent=indent, **options)


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}``: Hugging Face marks the assistant's part
    with it (for training masks); in a prompt it is just its body."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        line = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=line)


@functools.lru_cache(maxsize=64)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled (cached: every request of a model renders the same one), with
    what Hugging Face's environment has: loop controls, the generation tag, tojson."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag]
    )
    environment.globals["raise_exception"] = _raise
    environment.filters["tojson"] = _tojson
    try:
        return environment.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"line {exc.lineno}: {exc.message}") from exc


def render_chat(
    template: ChatTemplate, messages: list[dict[str, Any]], tools: list[Any] | None
) -> str:
    """The prompt for ``messages``, ending where the assistant's answer begins."""
    try:
        return compile_template(template.source).render(
            messages=messages,
            tools=tools,
            add_generation_prompt=True,
            bos_token=template.bos_token,
            eos_token=template.eos_token,
        )
    except TemplateError:
        raise
    except jinja2.TemplateError as exc:  # a sandbox refusal, an undefined call
        raise TemplateError(str(exc)) from exc
    except (RecursionError, MemoryError) as exc:
        raise TemplateError(f"{type(exc).__name__}: the template recursed or grew too far") from exc
    except Exception as exc:  # the template's own code failed on these messages
        raise TemplateError(f"{type(exc).__name__}: {exc}") from exc
