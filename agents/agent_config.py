"""The agent a command or a demo stage runs: its config, its identity, and lazy loading.

Every verb that runs a model (``rollout``, ``serve``, ``extract``, ``patch``, ``demo``) names it
the same way (:mod:`goalprobe.agents.models`) and builds its rollout engine here, so that one
agent gives one run id whichever verb recorded it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path
from typing import Any, cast

from goalprobe.agents.attention import resolve_attention
from goalprobe.agents.backend import SamplingConfig
from goalprobe.agents.chat_format import (
    FORMATS,
    HARMONY_DESCRIPTION_NAME,
    ChatFormat,
    HarmonyFormat,
    chat_format_for,
)
from goalprobe.agents.harmony import DEFAULT_SYSTEM, Message, ServedHarmony, served_harmony_in
from goalprobe.agents.local_backend import LocalBackend
from goalprobe.agents.models import (
    LoadedModel,
    check_model_name,
    describe_local_model,
    load_model,
    load_tokenizer,
    model_identity,
    resolve_device_dtype,
)
from goalprobe.agents.oracle_backend import DEFAULT_EPSILON, OracleBackend
from goalprobe.agents.server_backend import ServerBackend, ServerConfig
from goalprobe.agents.trajectories import read_run_header

ENGINES: tuple[str, ...] = ("local", "server", "oracle")
"""Rollout engines: transformers in this process, an OpenAI-compatible server, or the oracle
(:class:`~goalprobe.agents.oracle_backend.OracleBackend`: the optimal policy writes the episodes
in the model's chat format, and only the stages that read activations run the model)."""

SERVER_IN_FLIGHT = 128
"""Requests the demo keeps in flight on a server (vLLM batches up to ``--max-num-seqs``, 256
by default, and queues the rest); each stage's episodes in flight follow it."""


@dataclass(frozen=True)
class AgentConfig:
    """Which agent runs, and where."""

    model: str = "bundled"
    """A bundled agent's name, a local model directory or a Hugging Face id (with a server
    engine, also the model name sent to it)."""
    backend: str = "local"
    """Rollout engine, one of :data:`ENGINES` (the oracle runs the pipeline on a model that
    cannot yet do the task, such as a random one)."""
    base_url: str | None = None
    """OpenAI-compatible endpoint for ``backend="server"`` (e.g. ``http://127.0.0.1:8000/v1``)."""
    device: str = "cpu"
    """Torch device of the local model: ``cpu`` or ``cuda`` (the precision follows: fp32 on CPU,
    bf16 on CUDA)."""
    chat_format: str | None = None
    """The agent's chat format (:data:`goalprobe.agents.chat_format.FORMATS`); None detects it
    from the tokenizer. Any format but harmony enters :meth:`identity` and the run id."""
    oracle_epsilon: float = DEFAULT_EPSILON
    """With ``backend="oracle"``: the probability of a uniformly random move at a step (so the
    oracle's behaviour is not trivially perfect); ignored by the other engines."""
    local_weights: bool = True
    """Whether the stage handed this config may load the weights in this process. False only
    for the generation stages of a server engine (:meth:`for_generation`): their episodes do
    not depend on ``device``, which :meth:`identity` then leaves out."""
    conversation_date: str | None = None
    """The ``Current date:`` (``YYYY-MM-DD``) of every harmony prompt goalprobe renders, pinned
    so that no prompt depends on the day; a served model must carry the same date (vLLM:
    ``VLLM_SYSTEM_START_DATE``), checked against its prompts. None: no date line, and a served
    rendering keeps the server's date."""

    def __post_init__(self) -> None:
        if self.backend not in ENGINES:
            raise ValueError(f"backend must be one of {ENGINES}, got {self.backend!r}")
        if self.conversation_date is not None:
            try:
                date.fromisoformat(self.conversation_date)
            except ValueError:
                raise ValueError(
                    f"conversation_date must be YYYY-MM-DD, got {self.conversation_date!r}"
                ) from None
        if self.backend == "server" and not self.base_url:
            raise ValueError("backend 'server' needs base_url (the endpoint's /v1 URL)")
        check_model_name(self.model)
        if self.chat_format is not None and self.chat_format not in FORMATS:
            raise ValueError(
                f"chat_format must be one of {sorted(FORMATS)} or None, got {self.chat_format!r}"
            )
        if not 0.0 <= self.oracle_epsilon <= 1.0:
            raise ValueError(f"oracle_epsilon must be in [0, 1], got {self.oracle_epsilon}")

    def identity(self) -> dict[str, Any]:
        """What a stage's cache key records of this agent: the weights (a bundled agent's
        digest, else the name), the engine and, when the weights run in this process, the
        device, numeric precision and attention kernel they run at (the kernels compute the
        same maths, with numerics that differ from the 6th digit on: agents/attention.py)."""
        identity: dict[str, Any] = {
            **model_identity(self.model),
            "backend": self.backend,
            "base_url": self.base_url,
        }
        if self.conversation_date is not None:
            identity["conversation_date"] = self.conversation_date
        if self.chat_format not in (None, HARMONY_DESCRIPTION_NAME):
            identity["chat_format"] = self.chat_format
        if self.backend == "oracle":
            identity["oracle_epsilon"] = self.oracle_epsilon
        if self.local_weights:
            device, dtype = resolve_device_dtype(self.device, "auto")
            identity |= {
                "device": device,
                "dtype": str(dtype).removeprefix("torch."),
                "attention": resolve_attention("auto", device),
            }
        return identity

    def server_config(self) -> ServerConfig:
        """The server engine's settings: the study's rows must be of the prompts the model
        read, so the token ids are asked for and answers without them refused; the server's
        batch is kept full (:data:`SERVER_IN_FLIGHT`). ``ValueError`` unless a server engine.
        """
        if self.backend != "server" or self.base_url is None:
            raise ValueError(f"agent {self.model!r} does not run on a server")
        return ServerConfig(
            base_url=self.base_url,
            model=self.model,
            request_token_ids=True,
            require_token_ids=True,
            max_concurrency=SERVER_IN_FLIGHT,
        )

    def for_generation(self) -> AgentConfig:
        """What a stage that only generates receives: with a server or the oracle engine, this
        config without the local device (``local_weights=False``), so that the generation
        stages' cache keys do not depend on where the weight stages run (``goalprobe demo
        --device cuda`` after the server's generation reuses it); with the local engine, this
        config (the device and precision generate the episodes)."""
        if self.backend == "local":
            return self
        return replace(self, device="cpu", local_weights=False)


def local_backend(
    model: str,
    *,
    revision: str = "",
    device: str = "cpu",
    dtype: str = "auto",
    chat_format: Any = None,
) -> tuple[LocalBackend, dict[str, Any]]:
    """A :class:`LocalBackend` for ``model`` and the description trajectory files record
    (``chat_format``: the model's, looked up before loading; None detects it)."""
    loaded = load_model(model, revision=revision, device=device, dtype=dtype)
    backend = LocalBackend(loaded.model, loaded.tokenizer, chat_format=chat_format)
    return backend, describe_local_model(model, revision, backend.chat_format)


class Agent:
    """An :class:`AgentConfig`'s model and rollout engine, loaded once, on first use."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self._loaded: LoadedModel | None = None
        self._backend: tuple[Any, dict] | None = None
        self._tokenizer = None
        self._encoder: tuple[Any, dict[str, Any] | None] | None = None
        self._format: ChatFormat | None = None

    def chat_format(self) -> ChatFormat:
        """The agent's chat format: the config's, else the one its tokenizer supports
        (``ChatFormatError`` when it supports none, or not the config's)."""
        if self._format is None:
            self._format = chat_format_for(self.tokenizer(), self.config.chat_format)
        return self._format

    def tokenizer(self):
        """The model's tokenizer, without its weights (the local model's when loaded)."""
        if self._loaded is not None:
            return self._loaded.tokenizer
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.config.model)
        return self._tokenizer

    def loaded(self) -> LoadedModel:
        """The local model (fp32 on CPU, bf16 on CUDA): extraction, patching, local rollouts;
        ``ValueError`` for a generation stage's config (``local_weights=False``)."""
        if not self.config.local_weights:
            raise ValueError(
                "this agent config is a generation stage's (AgentConfig.for_generation): it "
                "names no device, so it loads no weights"
            )
        if self._loaded is None:
            self._loaded = load_model(self.config.model, device=self.config.device)
        return self._loaded

    def check_server(self) -> None:
        """Before any stage runs: one short request to the server, which must answer with the
        prompt and generated token ids (a down server or one without ids fails here, at once,
        with ``ServerError``, rather than in every generating stage).
        """
        completion = self._probe_request([Message("user", "Answer with one word.")], 4, 1)
        if self.config.conversation_date is not None and self._harmony():
            ids = completion.prompt_token_ids
            self._check_date(ServedHarmony.from_prompt_ids(self.tokenizer(), ids, 1))

    def _probe_request(self, conversation, max_new_tokens: int, max_retries: int | None = None):
        """The server's greedy completion of one short ``conversation`` (a 120 s timeout)."""
        backend, _ = self.rollout_backend()
        config = replace(backend.config, timeout_s=120.0)
        if max_retries is not None:
            config = replace(config, max_retries=max_retries)
        sampling = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, seed=0)
        return ServerBackend(config, backend.tokenizer).generate([conversation], sampling)[0]

    def _harmony(self) -> bool:
        return chat_format_for(self.tokenizer()).name == "harmony"

    def _check_date(self, served) -> None:
        """Refuse a served rendering whose date is not the pinned one."""
        pinned = self.config.conversation_date
        if pinned is not None and served.date != pinned:
            raise ValueError(
                f"the server renders 'Current date: {served.date}' but the agent pins "
                f"conversation_date {pinned}: start the server with VLLM_SYSTEM_START_DATE={pinned}"
            )

    def system(self):
        """The harmony system message goalprobe renders (the pinned date, if any)."""
        return replace(DEFAULT_SYSTEM, conversation_start_date=self.config.conversation_date)

    def prompt_encoder(self, rollouts: Path | None = None) -> tuple[Any, dict[str, Any] | None]:
        """``(encode, rendering)``: how a prompt goalprobe renders itself (the probing set, every
        prompt-only state) is tokenised so that it is the prompt the rollouts' model read.

        A harmony model served by a chat endpoint: the server's rendering
        (:class:`~goalprobe.agents.harmony.ServedHarmony`) and its description (record it
        with the prompts), read off the served prompts of ``rollouts`` (this agent's trajectory
        file) when it was generated on a server (even one since restarted or down), else off
        one short request. Otherwise the chat format's own rendering and None.
        """
        if self._encoder is None:
            fmt = self.chat_format()
            self._encoder = (fmt.encode_prompt, None)
            if self.config.backend == "server" and fmt.name == "harmony":
                served = self._served_harmony(rollouts)
                self._check_date(served)
                self._encoder = (served.encode_prompt, served.describe())
            elif fmt.name == "harmony" and self.config.conversation_date is not None:
                dated = replace(cast(HarmonyFormat, fmt), system=self.system())
                rendering = {"rendering": "goalprobe", "date": self.config.conversation_date}
                self._encoder = (dated.encode_prompt, rendering)
        return self._encoder

    def _served_harmony(self, rollouts: Path | None):
        if rollouts is not None and rollouts.is_file():
            if read_run_header(rollouts).backend.get("class") == "ServerBackend":
                found = served_harmony_in(self.tokenizer(), rollouts)
                if found is not None:
                    return found

        conversation = [Message("developer", "Answer with one word."), Message("user", "Hello.")]
        completion = self._probe_request(conversation, 1)
        return ServedHarmony.from_prompt_ids(self.tokenizer(), completion.prompt_token_ids)

    def rollout_backend(self) -> tuple[Any, dict]:
        """``(backend, description)`` for :func:`goalprobe.agents.rollout.run_rollouts`."""
        if self._backend is None:
            if self.config.backend == "server":
                backend = ServerBackend(
                    self.config.server_config(), self.tokenizer(), chat_format=self.chat_format()
                )
                self._backend = (backend, backend.describe())
            elif self.config.backend == "oracle":
                oracle = OracleBackend(
                    self.tokenizer(), self.chat_format(), epsilon=self.config.oracle_epsilon
                )
                self._backend = (oracle, {**oracle.describe(), **model_identity(self.config.model)})
            else:
                loaded = self.loaded()
                local = LocalBackend(
                    loaded.model,
                    loaded.tokenizer,
                    system=self.system(),
                    chat_format=self.chat_format(),
                )
                self._backend = (
                    local,
                    describe_local_model(self.config.model, chat_format=local.chat_format),
                )
            if self.config.conversation_date is not None:  # recorded in the run header
                self._backend[1]["conversation_date"] = self.config.conversation_date
        return self._backend
