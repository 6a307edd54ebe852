"""A fake vLLM: an OpenAI-compatible chat-completions server that answers as vLLM's gpt-oss
serving does, in its current and older shapes, generating with the tiny random GPT-OSS.

What it copies from vLLM (``vllm/entrypoints/openai/serving_chat.py`` and ``harmony_utils.py``):

* **The served prompt.** vLLM renders harmony itself with openai-harmony: a system message with
  a ``Current date:`` line and the valid channels ``analysis, final`` (``commentary`` removed
  when no tools are given); the request's ``developer``/``system`` messages as plain text
  messages (no ``# Instructions`` header); older versions put an empty developer message
  before them. So its prompt ids differ from goalprobe's rendering.
* **Token ids.** Request field ``return_token_ids``; response fields ``prompt_token_ids`` (top
  level) and ``choices[0].token_ids`` (the generated ids, stop token included). Some versions
  do not honour the field (:attr:`VllmShape.token_ids` False): the fields stay null.
* **Text fields.** ``message.content`` and the reasoning in ``message.reasoning`` (current) or
  ``message.reasoning_content`` (older). Older vLLM's ``parse_chat_output`` took the first of a
  single message as reasoning, so an answer without an analysis message came back in the
  reasoning field with empty content (:attr:`VllmShape.legacy_parser`).

Generation is real but steered so that answers parse: the tiny model samples a few reasoning
tokens (restricted to ordinary words) and then the action among the four action words, each
from its own logits with the request's seed; the harmony structure around them is fixed. Every
returned id is a real o200k_harmony token and the completion decodes to valid harmony.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass, field

import torch
from agent_fixtures import serving
from fastapi import FastAPI, Request

REASONING_WORDS = (" go", " the", " goal", " is", " near", " move", " wall", " path", " so")
ACTIONS = ("UP", "DOWN", "LEFT", "RIGHT")
VLLM_VERSION = "0.11.1"
"""The version the fake server reports at ``GET /version``."""


@dataclass(frozen=True)
class VllmShape:
    """Which vLLM the fake server behaves as."""

    reasoning_field: str = "reasoning"
    """``"reasoning"`` (current vLLM) or ``"reasoning_content"`` (older)."""
    token_ids: bool = True
    """Honour ``return_token_ids`` (False: a version that returns no ids for gpt-oss)."""
    generated_ids: bool = True
    """Return the generated ids too (False: vLLM 0.10.2-0.11.0 for gpt-oss, which returned
    ``prompt_token_ids`` but ``token_ids: null``, vllm-project/vllm#28246)."""
    empty_developer: bool = False
    """Older vLLM: an empty developer message before the request's messages."""
    legacy_parser: bool = False
    """Older vLLM's output parser: a single message goes to the reasoning field."""
    no_analysis: bool = False
    """The model answers without an analysis message (straight into the final channel)."""
    date: str = "2026-11-27"
    """The ``Current date:`` of the system message."""


CURRENT = VllmShape()
OLDER = VllmShape(
    reasoning_field="reasoning_content", empty_developer=True, legacy_parser=True, no_analysis=True
)
NO_IDS = VllmShape(token_ids=False)
PROMPT_IDS_ONLY = VllmShape(generated_ids=False)


@dataclass
class FakeVllmLog:
    """What the fake server saw."""

    requests: list[dict] = field(default_factory=list)
    """Every request body, in arrival order."""
    prompts: list[list[int]] = field(default_factory=list)
    """The prompt ids it rendered for them."""


def render_like_vllm(encoding, messages: list[dict], effort: str, shape: VllmShape) -> list[int]:
    """The prompt ids vLLM's chat completions give gpt-oss for ``messages``."""
    from openai_harmony import (
        ChannelConfig,
        Conversation,
        DeveloperContent,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        TextContent,
    )

    system = (
        SystemContent.new()
        .with_reasoning_effort(ReasoningEffort(effort.capitalize()))
        .with_conversation_start_date(shape.date)
    )
    channels = [c for c in system.channel_config.valid_channels if c != "commentary"]
    system = system.with_channel_config(ChannelConfig.require_channels(channels))
    out = [Message.from_role_and_content(Role.SYSTEM, system)]
    if shape.empty_developer:
        out.append(Message.from_role_and_content(Role.DEVELOPER, DeveloperContent.new()))
    for message in messages:
        content = message["content"]
        text = content if isinstance(content, str) else "".join(p["text"] for p in content)
        out.append(Message.from_role_and_contents(Role(message["role"]), [TextContent(text=text)]))
    conversation = Conversation.from_messages(out)
    return list(encoding.render_conversation_for_completion(conversation, Role.ASSISTANT))


class _Generator:
    """The tiny model, steered: a few sampled reasoning words, then a sampled action."""

    def __init__(self, model, tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.lock = threading.Lock()
        self.words = [self._one(w) for w in REASONING_WORDS]
        self.actions = [self._one(a) for a in ACTIONS]

    def _one(self, text: str) -> int:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == 1, (text, ids)
        return ids[0]

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _plan(self, seed: int, analysis: bool) -> list[list[int] | None]:
        """Fixed ids, or None: one sampled token (harmony's channels around them)."""
        plan: list[list[int] | None] = []
        if analysis:
            plan += [self._ids("<|channel|>analysis<|message|>")] + [None] * (2 + seed % 4)
            plan += [self._ids("<|end|><|start|>assistant")]
        plan += [self._ids('<|channel|>final<|message|>{"action": "'), None]
        return plan + [self._ids('"}<|return|>')]

    def generate(
        self, prompt: list[int], *, seed: int, temperature: float, max_tokens: int, analysis: bool
    ) -> tuple[list[int], bool]:
        """``(generated ids, cut off by max_tokens)``: the model's cache follows the ids."""
        generator = torch.Generator().manual_seed(int(seed))
        plan = self._plan(seed, analysis)
        last_sampled = max(i for i, part in enumerate(plan) if part is None)
        out: list[int] = []
        pending = list(prompt)
        past = None
        with self.lock, torch.no_grad():
            for i, part in enumerate(plan):
                if part is not None:
                    out += part
                    pending += part
                    continue
                result = self.model(
                    torch.tensor([pending]), cache=past, use_cache=True, logits_to_keep=1
                )
                past = result.past_key_values
                allowed = self.actions if i == last_sampled else self.words
                logits = result.logits[0, -1, allowed].double()
                if temperature <= 0:
                    chosen = allowed[int(logits.argmax())]
                else:
                    probs = torch.softmax(logits / temperature, dim=0)
                    chosen = allowed[int(torch.multinomial(probs, 1, generator=generator))]
                out.append(chosen)
                pending = [chosen]
        if len(out) > max_tokens:
            return out[:max_tokens], True
        return out, False


def _parse_like_vllm(encoding, ids: list[int], shape: VllmShape) -> tuple[str, str | None]:
    """``(reasoning, content)`` as vLLM's ``parse_chat_output`` gives them."""
    from openai_harmony import Role, StreamableParser

    parser = StreamableParser(encoding, role=Role.ASSISTANT)
    for token in ids:
        parser.process(token)
    messages = parser.messages
    if shape.legacy_parser:
        if not messages:
            return parser.current_content, None
        if len(messages) == 1:
            return messages[0].content[0].text, parser.current_content
        return (
            "\n".join(m.content[0].text for m in messages[:-1]),
            messages[-1].content[0].text,
        )
    reasoning = [m.content[0].text for m in messages if m.channel == "analysis"]
    final = [m.content[0].text for m in messages if m.channel == "final"]
    if parser.current_channel == "analysis":
        reasoning.append(parser.current_content)
    elif parser.current_channel == "final":
        final.append(parser.current_content)
    return "\n".join(reasoning), ("\n".join(final) if final else None)


def fake_vllm_app(
    model, tokenizer, encoding, shape: VllmShape, log: FakeVllmLog, delay=None
) -> FastAPI:
    """The app (see the module doc); ``delay(body) -> seconds`` holds chosen answers back."""
    app = FastAPI()
    generator = _Generator(model, tokenizer)

    @app.get("/health")
    def health():
        return {}

    @app.get("/version")
    def version():  # vLLM's route (vllm/entrypoints/openai/api_server.py)
        return {"version": VLLM_VERSION}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        log.requests.append(body)
        effort = body.get("reasoning_effort") or "medium"
        prompt = render_like_vllm(encoding, body["messages"], effort, shape)
        log.prompts.append(prompt)
        seed = int(body.get("seed") or 0)
        generated, cut = generator.generate(
            prompt,
            seed=seed,
            temperature=float(body.get("temperature", 1.0)),
            max_tokens=int(body.get("max_tokens") or 10_000),
            analysis=not shape.no_analysis,
        )
        seconds = delay(body) if delay is not None else 0.0
        if seconds > 0:
            await asyncio.sleep(seconds)
        reasoning, content = _parse_like_vllm(encoding, generated, shape)
        ids = shape.token_ids and bool(body.get("return_token_ids"))
        message = {"role": "assistant", "content": content, "tool_calls": []}
        message[shape.reasoning_field] = reasoning or None
        return {
            "id": f"chatcmpl-{len(log.requests)}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "length" if cut else "stop",
                    "token_ids": generated if ids and shape.generated_ids else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(generated),
                "total_tokens": len(prompt) + len(generated),
            },
            "prompt_token_ids": prompt if ids else None,
        }

    return app


@contextlib.contextmanager
def fake_vllm(gptoss_tiny, encoding, shape: VllmShape = CURRENT, delay=None):
    """Serve :func:`fake_vllm_app` on loopback; yields ``(base_url_v1, FakeVllmLog)``."""
    log = FakeVllmLog()
    app = fake_vllm_app(gptoss_tiny.model, gptoss_tiny.tokenizer, encoding, shape, log, delay)
    with serving(app) as url:
        yield f"{url}/v1", log


# ---------------------------------------------------------------------------------------------
# A think-tag model behind vLLM (``vllm serve Qwen/Qwen3-8B --reasoning-parser qwen3``)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThinkTagShape:
    """Which vLLM the think-tag fake behaves as."""

    reasoning_field: str = "reasoning_content"
    """The message field of the reasoning parser's output (``reasoning_content``; vLLM
    >= 0.11 also ``reasoning``)."""
    token_ids: bool = True
    """Honour ``return_token_ids``."""


class _ThinkTagGenerator(_Generator):
    """The tiny Qwen3, steered: ``<think>\\n``, a few sampled words, ``\\n</think>\\n\\n``, a
    sampled action in an answer, ``<|im_end|>``."""

    def _plan(self, seed: int, analysis: bool) -> list[list[int] | None]:
        plan: list[list[int] | None] = [self._ids("<think>\n")] + [None] * (2 + seed % 4)
        plan += [self._ids("\n</think>\n\n"), self._ids('{"action": "'), None]
        return plan + [self._ids('"}'), [self.tokenizer.eos_token_id]]


def parse_like_qwen3_reasoning_parser(text: str) -> tuple[str | None, str | None]:
    """``(reasoning, content)`` of vLLM's ``qwen3`` reasoning parser on the decoded output
    (special tokens skipped): the text between ``<think>`` and ``</think>`` as it is (delimiter
    newlines kept), the rest after ``</think>``; output cut off inside the reasoning is all
    reasoning."""
    start = text.find("<think>")
    body = text[start + len("<think>") :] if start >= 0 else text
    if "</think>" not in body:
        return body, None
    reasoning, _, content = body.partition("</think>")
    return reasoning, content or None


def fake_vllm_thinktag_app(model, tokenizer, shape: ThinkTagShape, log: FakeVllmLog) -> FastAPI:
    """vLLM serving a think-tag model: the prompt is the tokenizer's chat template applied to
    the request's messages with its ``chat_template_kwargs``; the reasoning parser splits the
    answer."""
    app = FastAPI()
    generator = _ThinkTagGenerator(model, tokenizer)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        log.requests.append(body)
        text = tokenizer.apply_chat_template(
            body["messages"],
            tokenize=False,
            add_generation_prompt=True,
            **(body.get("chat_template_kwargs") or {}),
        )
        prompt = list(tokenizer.encode(text, add_special_tokens=False))
        log.prompts.append(prompt)
        generated, cut = generator.generate(
            prompt,
            seed=int(body.get("seed") or 0),
            temperature=float(body.get("temperature", 1.0)),
            max_tokens=int(body.get("max_tokens") or 10_000),
            analysis=True,
        )
        decoded = tokenizer.decode(generated, skip_special_tokens=True)
        reasoning, content = parse_like_qwen3_reasoning_parser(decoded)
        ids = shape.token_ids and bool(body.get("return_token_ids"))
        message = {"role": "assistant", "content": content, "tool_calls": []}
        message[shape.reasoning_field] = reasoning
        return {
            "id": f"chatcmpl-{len(log.requests)}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "length" if cut else "stop",
                    "token_ids": generated if ids else None,
                }
            ],
            "prompt_token_ids": prompt if ids else None,
        }

    return app


@contextlib.contextmanager
def fake_vllm_thinktag(qwen3_tiny, shape: ThinkTagShape = ThinkTagShape()):
    """Serve :func:`fake_vllm_thinktag_app` on loopback; yields ``(base_url_v1, FakeVllmLog)``."""
    log = FakeVllmLog()
    app = fake_vllm_thinktag_app(qwen3_tiny.model, qwen3_tiny.tokenizer, shape, log)
    with serving(app) as url:
        yield f"{url}/v1", log
