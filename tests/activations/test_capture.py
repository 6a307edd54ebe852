"""Residual-stream backends (nnsight, TransformerLens, plain hooks) on a tiny random GPT-OSS:
capture for extraction, and the clean and patched runs of the patching experiment."""

from __future__ import annotations

import copy
import email
import json
import socket
import threading
import time

import numpy as np
import pytest
import torch
from agent_fixtures import tiny_gpt_oss as shared_tiny_gpt_oss
from goalprobe.activations.capture import BACKENDS, Patch, TokenBatch, make_backend
from goalprobe.activations.capture.backends import RemoteCaptureError, ndif_model_key
from goalprobe.activations.capture.base import (
    ResidualBackend,
    decoder_layers_path,
    get_submodule_path,
)
from goalprobe.agents.harmony import (
    HarmonyTokenIds,
    Message,
    find_anchors,
    render_completion,
    render_prompt,
)
from goalprobe.agents.tokenizer import build_tokenizer

LAYERS = [0, 2]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tiny_gpt_oss(tokenizer, seed: int = 0, dtype=torch.float32):
    """A random 4-block GPT-OSS (MoE, sinks, alternating sliding/full attention)."""
    return shared_tiny_gpt_oss(
        tokenizer, layers=4, heads=4, kv_heads=2, head_dim=8, experts=4, experts_per_token=2,
        sliding_window=16, max_positions=1024, seed=seed,
    ).eval().to(dtype)  # fmt: skip


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_gpt_oss(tokenizer)


@pytest.fixture(scope="module")
def batch(tokenizer):
    """Three harmony sequences of different lengths and their six anchor positions each."""
    special = HarmonyTokenIds.from_tokenizer(tokenizer)
    grids = ["  0 1 2\n0 # A #\n1 # _ G\n2 # # #", "  0 1\n0 A G\n1 # #", "  0 1 2\n0 A _ G"]
    seqs, positions = [], []
    for i, grid in enumerate(grids):
        prompt = render_prompt([Message("developer", "Reach the goal."), Message("user", grid)])
        completion = render_completion("A is at (0, 1). Plan: DOWN." * (i + 1), '{"action": "UP"}')
        ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"]
        anchors = find_anchors(ids, special)
        seqs.append(ids)
        positions.append([*anchors.pre_reasoning, *anchors.post_reasoning])
    return TokenBatch.from_sequences(seqs, positions, pad_id=tokenizer.pad_token_id)


def solo_reference(model, batch: TokenBatch) -> dict[int, torch.Tensor]:
    """Block outputs of every row run alone and unpadded (``output_hidden_states``)."""
    out = {layer: [] for layer in LAYERS}
    with torch.inference_mode():
        for i in range(batch.size):
            n = int(batch.attention_mask[i].sum())
            hidden = model(batch.input_ids[i : i + 1, :n], output_hidden_states=True).hidden_states
            for layer in LAYERS:
                out[layer].append(hidden[layer + 1][0, batch.positions[i]])
    return {layer: torch.stack(v) for layer, v in out.items()}


class CallCounter:
    """Counts forward calls of modules (to prove a forward pass stopped early)."""

    def __init__(self, modules):
        self.calls = 0
        self.handles = [m.register_forward_hook(self._hook) for m in modules]

    def _hook(self, *args):
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


def later_modules(model):
    """The blocks after the last requested one, the final norm and the unembedding."""
    blocks = get_submodule_path(model, decoder_layers_path(model))
    return [*(blocks[i] for i in range(max(LAYERS) + 1, len(blocks))), model.lm_head]


def test_token_batch_pads_right_and_checks_positions():
    b = TokenBatch.from_sequences([[5, 6, 7], [8]], [[0, 2], [0, 0]], pad_id=1)
    assert b.input_ids.tolist() == [[5, 6, 7], [8, 1, 1]]
    assert b.attention_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(ValueError, match="row 1"):
        TokenBatch.from_sequences([[5, 6, 7], [8]], [[0, 2], [0, 1]])


@pytest.mark.parametrize("backend", ["hooks", "nnsight", "transformer_lens"])
def test_backends_agree_with_unpadded_forward_and_stop_early(model, tokenizer, batch, backend):
    reference = solo_reference(model, batch)
    # the TransformerLens bridge rewrites the model it wraps: here our own copy, so that the
    # counter watches the modules that run
    target = copy.deepcopy(model) if backend == "transformer_lens" else model
    options = {"copy_model": False} if backend == "transformer_lens" else {}
    capture = make_backend(backend, target, tokenizer, **options)
    # the shared prompt prefix runs once per backend (its KV cache is then reused by every
    # batch and every patch), through every block: warm it before counting
    capture.capture(batch, LAYERS)
    counter = CallCounter(later_modules(target))
    try:
        got = capture.capture(batch, LAYERS)
    finally:
        counter.remove()
    assert counter.calls == 0, f"{backend} ran blocks after {max(LAYERS)} or the unembedding"
    for layer in LAYERS:
        assert got[layer].shape == (3, 6, 32) and got[layer].device.type == "cpu"
        torch.testing.assert_close(got[layer], reference[layer], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="0 .. 3"):
        capture.capture(batch, [4])


@pytest.mark.parametrize("backend", ["hooks", "nnsight"])
def test_the_shared_prefix_runs_once_and_changes_nothing(model, tokenizer, batch, backend):
    """The rows' shared system and developer prefix runs once and the batch continues from its
    KV cache: the same activations as whole sequences, to float tolerance."""
    assert ResidualBackend.shared_prefix_length(batch) >= 16
    cached = make_backend(backend, model, tokenizer)
    whole = make_backend(backend, model, tokenizer, prefix_cache=False)
    assert cached.prefix_cache and not whole.prefix_cache
    got, reference = cached.capture(batch, LAYERS), whole.capture(batch, LAYERS)
    for layer in LAYERS:
        torch.testing.assert_close(got[layer], reference[layer], rtol=1e-5, atol=1e-5)
    assert cached._cached_prefix is not None and whole._cached_prefix is None
    # rows that share nothing before a read position run whole
    early = TokenBatch.from_sequences(
        [batch.input_ids[0, :30].tolist()] * 2, [[0, 1], [2, 3]], pad_id=0
    )
    assert ResidualBackend.shared_prefix_length(early) == 0


@pytest.mark.parametrize("backend", ["hooks", "nnsight"])
def test_one_cached_prefix_serves_batches_that_share_more(model, tokenizer, batch, backend):
    """Rows of one grid share more than the system and developer prefix, so each batch's shared
    prefix differs: the cached prefix stops at the last message start, so batches of different
    grids reuse it (no new prefix run), and every batch equals whole-sequence capture."""
    cached = make_backend(backend, model, tokenizer)
    whole = make_backend(backend, model, tokenizer, prefix_cache=False)
    lengths = [int(n) for n in batch.attention_mask.sum(dim=1)]
    rows = [batch.input_ids[i, : lengths[i]].tolist() for i in range(batch.size)]
    positions = batch.positions.tolist()
    # two copies of one row share everything before its first read position
    single = [TokenBatch.from_sequences([rows[i]] * 2, [positions[i]] * 2) for i in range(3)]
    caches = []
    for b in (*single, batch):
        got, reference = cached.capture(b, LAYERS), whole.capture(b, LAYERS)
        for layer in LAYERS:
            torch.testing.assert_close(got[layer], reference[layer], rtol=1e-5, atol=1e-5)
        caches.append(cached._cached_prefix)
    start = tokenizer.convert_tokens_to_ids("<|start|>")
    prefix = np.frombuffer(caches[0][0], dtype=np.int64)
    assert cached.min_shared_prefix <= len(prefix) < ResidualBackend.shared_prefix_length(single[0])
    assert rows[0][len(prefix)] == start  # the user message starts right after it
    assert all(c is caches[0] for c in caches)  # one prefix run for every batch


def test_hooks_and_nnsight_are_bitwise_equal_on_the_same_batch(model, tokenizer, batch):
    hooks = make_backend("hooks", model, tokenizer).capture(batch, LAYERS)
    traced = make_backend("nnsight", model, tokenizer).capture(batch, LAYERS)
    for layer in LAYERS:
        assert torch.equal(hooks[layer], traced[layer])


def test_nnsight_remote_simulation_agrees(model, tokenizer, batch):
    # serialises the trace like a real NDIF request and runs it with local modules hidden (a
    # remote trace runs whole sequences: no KV cache leaves the host)
    hooks = make_backend("hooks", model, tokenizer, prefix_cache=False).capture(batch, LAYERS)
    simulated = make_backend("nnsight", model, tokenizer, remote="local").capture(batch, LAYERS)
    for layer in LAYERS:
        torch.testing.assert_close(simulated[layer], hooks[layer], rtol=0, atol=0)


class FakeNdif:
    """A real HTTP + websocket server on 127.0.0.1 speaking NDIF's request protocol.

    It records the request and answers with an ERROR status (it runs nothing).
    """

    def __init__(self):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route, WebSocketRoute

        self.requests: list[dict] = []

        async def subscribe(websocket):
            await websocket.accept()
            await websocket.send_text(json.dumps({"session_id": "session-1"}))
            try:
                while True:
                    await websocket.receive_text()
            except Exception:  # noqa: BLE001 - client closed the socket
                return

        async def request(req):
            body = await req.body()
            head = f"Content-Type: {req.headers['content-type']}\r\n\r\n".encode()
            message = email.message_from_bytes(head + body)
            fields = {
                part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                for part in message.get_payload()
            }
            self.requests.append(
                {
                    "metadata": json.loads(fields["data"]),
                    "blob": fields["blob"],
                    "headers": dict(req.headers),
                }
            )
            return JSONResponse(
                {"id": "job-1", "status": "ERROR", "description": "fake NDIF: request recorded"}
            )

        app = Starlette(
            routes=[
                WebSocketRoute("/subscribe", subscribe),
                Route("/request", request, methods=["POST"]),
            ]
        )
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="error", ws="wsproto", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]})
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("fake NDIF server did not start")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_nnsight_remote_sends_the_trace_to_ndif(model, tokenizer, batch):
    import zstandard
    from nnsight.schema.request import RequestModel

    server = FakeNdif()
    try:
        capture = make_backend(
            "nnsight",
            model,
            tokenizer,
            remote=True,
            model_id="openai/gpt-oss-20b",
            revision="main",
            host=server.url,
        )
        with pytest.raises(RemoteCaptureError, match="fake NDIF: request recorded") as info:
            capture.capture(batch, LAYERS)
        assert "openai/gpt-oss-20b" in str(info.value) and server.url in str(info.value)
    finally:
        server.close()
    (sent,) = server.requests
    key = sent["metadata"]["model_key"]
    assert key == ndif_model_key("openai/gpt-oss-20b", "main")
    path, payload = key.split(":", 1)
    assert path.endswith("TransformersModel")
    assert json.loads(payload) == {
        "repo_id": "openai/gpt-oss-20b",
        "revision": "main",
        "task": "text-generation",
    }
    assert sent["metadata"]["session_id"] == "session-1"
    assert sent["metadata"]["env"]["attn_implementation"] == model.config._attn_implementation
    # the payload is the serialised trace, which the server can rebuild against its model
    blob = sent["blob"]
    if sent["metadata"]["compress"]:
        blob = zstandard.ZstdDecompressor().decompress(blob)
    tracer = RequestModel.deserialize(blob, capture.lm._remoteable_persistent_objects())
    assert "stop" in json.dumps(str(tracer.info.code.co_names))


def test_bfloat16_batch_matches_float32_loosely(tokenizer, batch):
    # bf16 is what GPU runs use; the capture path casts nothing itself
    model32 = tiny_gpt_oss(tokenizer, seed=1)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    a = make_backend("hooks", model32, tokenizer).capture(batch, LAYERS)
    b = make_backend("nnsight", model16, tokenizer).capture(batch, LAYERS)
    for layer in LAYERS:
        assert b[layer].dtype == torch.bfloat16
        rel = (b[layer].float() - a[layer]).norm() / a[layer].norm()
        assert rel < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["nnsight", "transformer_lens"])
def test_cuda_bf16_backends_agree_with_hooks(tokenizer, batch, backend):
    base = tiny_gpt_oss(tokenizer, seed=2, dtype=torch.bfloat16).to("cuda")
    reference = make_backend("hooks", base, tokenizer).capture(batch, LAYERS)
    target = copy.deepcopy(base) if backend == "transformer_lens" else base
    got = make_backend(backend, target, tokenizer).capture(batch, LAYERS)
    for layer in LAYERS:
        torch.testing.assert_close(
            got[layer].float(), reference[layer].float(), rtol=0.02, atol=0.02
        )


def test_bundled_agent_backends_agree(bundled_agent):
    from goalprobe.agents.prompts import build_messages

    model, tok = bundled_agent
    special = HarmonyTokenIds.from_tokenizer(tok)
    seqs, positions = [], []
    for grid in ("  0 1 2\n0 # A #\n1 # _ G\n2 # # #", "  0 1\n0 A G\n1 # #"):
        prompt = render_prompt(build_messages(grid, variant="plain", has_key=False))
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        seqs.append(ids)
        positions.append(list(find_anchors(ids, special).pre_reasoning))
    b = TokenBatch.from_sequences(seqs, positions, pad_id=tok.pad_token_id)
    n = model.config.num_hidden_layers
    layers = sorted({0, n // 2, n - 1})
    reference = make_backend("hooks", model, tok).capture(b, layers)
    for name in ("nnsight", "transformer_lens"):
        target = copy.deepcopy(model) if name == "transformer_lens" else model
        got = make_backend(name, target, tok).capture(b, layers)
        for layer in layers:
            torch.testing.assert_close(got[layer], reference[layer], rtol=1e-4, atol=1e-4)


def test_unknown_backend_and_missing_tokenizer(model):
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("pyvene", model)
    with pytest.raises(ValueError, match="tokenizer"):
        make_backend("nnsight", model)


@pytest.fixture(scope="module")
def patching_backends(tokenizer):
    """Every backend around its own copy of one tiny GPT-OSS (the bridge rewrites its model)."""
    model = tiny_gpt_oss(tokenizer, seed=3)
    return {name: make_backend(name, copy.deepcopy(model), tokenizer) for name in BACKENDS}


def test_backends_give_equal_residuals_and_patched_logits(patching_backends, batch):
    """Clean runs (residual stream at every layer and position, last logits) and patched
    logits (one layer, several layers, a readout before the end) agree across the backends."""
    n = int(batch.attention_mask[0].sum())
    target = batch.input_ids[0, :n].tolist()
    source = [*target[:-4], *batch.input_ids[1, 2:6].tolist()]  # four tokens differ at the end
    positions = np.arange(n)
    noise = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(0))
    results = {}
    for name, backend in patching_backends.items():
        assert backend.n_layers == 4 and backend.d_model == 32
        clean = backend.clean_run(target, range(4), positions)
        donor = backend.clean_run(source, range(4), positions)
        late = torch.as_tensor(positions[-4:])
        patches = [
            Patch((1,), late, donor.values([1], positions[-4:])),
            Patch((0, 3), late[:3], noise),
            Patch((2,), torch.as_tensor(positions), donor.values([2], positions)),
        ]
        results[name] = (
            clean,
            backend.patched_logits(target, patches),
            backend.patched_logits(target, patches[:2], readout_position=n - 3),
        )
        # a source run patched in whole at one layer is the source run
        torch.testing.assert_close(results[name][1][2], donor.logits, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(results[name][1][0], clean.logits, atol=1e-3)
    ref_clean, ref_last, ref_early = results["hooks"]
    for name in ("nnsight", "transformer_lens"):
        clean, last, early = results[name]
        assert clean.layers == ref_clean.layers and clean.acts.shape == (4, n, 32)
        torch.testing.assert_close(clean.acts, ref_clean.acts, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(clean.logits, ref_clean.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(last, ref_last, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(early, ref_early, rtol=1e-4, atol=1e-4)
    # nnsight and hooks make the same edit in the same forward pass: bitwise equal
    assert torch.equal(results["nnsight"][0].acts, ref_clean.acts)
    assert torch.equal(results["nnsight"][1], ref_last)


def test_backends_generate_alike_under_a_patch(patching_backends, batch, tokenizer):
    n = int(batch.attention_mask[2].sum())
    prompt = batch.input_ids[2, :n].tolist()
    positions = np.arange(n)
    stop = [tokenizer.convert_tokens_to_ids("<|return|>")]
    noise = torch.randn(1, n, 32, generator=torch.Generator().manual_seed(1)) * 3
    outputs = {}
    for name, backend in patching_backends.items():
        own = backend.clean_run(prompt, [1], positions)
        patches = [
            Patch((1,), torch.as_tensor(positions), own.values([1], positions)),
            Patch((1,), torch.as_tensor(positions), noise),
        ]
        outputs[name] = backend.generate(prompt, patches, max_new_tokens=5, stop_ids=stop)
    assert outputs["nnsight"] == outputs["hooks"] == outputs["transformer_lens"]
    unpatched = (
        patching_backends["hooks"]
        .model.generate(
            torch.as_tensor([prompt]), max_new_tokens=5, do_sample=False, eos_token_id=stop
        )[0, n:]
        .tolist()
    )
    # writing a run's own residual stream back is a no-op; noise changes the completion
    assert outputs["hooks"][0] == unpatched[: len(outputs["hooks"][0])]
    assert outputs["hooks"][1] != outputs["hooks"][0]


def test_transformer_lens_leaves_the_model_it_is_given_intact(tokenizer, batch):
    """The bridge breaks cached decoding of the model it wraps; the backend wraps a copy."""
    model = tiny_gpt_oss(tokenizer, seed=4)
    n = int(batch.attention_mask[2].sum())
    prompt = batch.input_ids[2:3, :n]

    def greedy(m):
        return m.generate(prompt, max_new_tokens=6, do_sample=False, min_new_tokens=6)[0, n:]

    before = greedy(model)
    backend = make_backend("transformer_lens", model, tokenizer)
    assert backend.model is model and backend.bridge.original_model is not model
    assert torch.equal(greedy(model), before)


def test_pooled_generation_reuses_the_shared_prefix_with_the_same_completions(tokenizer):
    """Regenerations of several equal-length prompts with late patches: the shared system and
    developer messages run once (the prefix cache), and every completion is the one the full
    prefill gives (hooks and nnsight, greedy)."""
    model = tiny_gpt_oss(tokenizer, seed=5)
    developer = Message("developer", "Reach the goal. " * 6)
    prompts = [
        tokenizer(
            render_prompt([developer, Message("user", f"  0 1\n0 A {cell}\n1 # #")]),
            add_special_tokens=False,
        )["input_ids"]
        for cell in ("G", "_")
    ]
    assert len(prompts[0]) == len(prompts[1]) and prompts[0] != prompts[1]
    n = len(prompts[0])
    late = torch.as_tensor(np.arange(n - 6, n))
    noise = torch.randn(3, 6, 32, generator=torch.Generator().manual_seed(2)) * 3
    patches = [Patch((1,), late, noise[:1]), Patch((0, 3), late[2:], noise[1:, 2:])]
    stop = [tokenizer.convert_tokens_to_ids("<|return|>")]
    for name in ("hooks", "nnsight"):
        outputs = []
        for cached in (True, False):
            backend = make_backend(name, copy.deepcopy(model), tokenizer, prefix_cache=cached)
            ids = torch.as_tensor(prompts)
            start, _, _ = backend._generation_prefix(ids, patches, 8, stop)
            assert (start > 16) == cached  # the developer message runs once
            outputs.append(backend.generate(prompts, patches, max_new_tokens=8, stop_ids=stop))
        assert outputs[0] == outputs[1]
        unpatched = model.generate(
            torch.as_tensor(prompts), max_new_tokens=8, do_sample=False, eos_token_id=stop
        )[:, n:]
        assert outputs[0][0] != strip_unpatched(unpatched[0].tolist(), stop)  # the patch acts


def strip_unpatched(ids: list[int], stop: list[int]) -> list[int]:
    """A raw greedy continuation cut after its first stop id (as the backends return it)."""
    for i, token in enumerate(ids):
        if token in stop:
            return ids[: i + 1]
    return ids


def test_clean_runs_from_the_cached_template_prefix_read_the_same_values(tokenizer, batch):
    """A clean run read after the system and developer messages continues from their cached KV
    prefix (hooks, nnsight); values and logits equal the full run's up to float rounding, and
    a read position inside the prefix runs the whole sequence."""
    model = tiny_gpt_oss(tokenizer, seed=6)
    n = int(batch.attention_mask[2].sum())
    ids = batch.input_ids[2, :n].numpy()
    late = np.arange(n - 8, n)
    for name in ("hooks", "nnsight"):
        cached = make_backend(name, copy.deepcopy(model), tokenizer, prefix_cache=True)
        full = make_backend(name, copy.deepcopy(model), tokenizer, prefix_cache=False)
        start, _ = cached._clean_prefix(ids, late)
        assert start > 16 and cached._clean_prefix(ids, np.arange(n))[0] == 0
        a, b = cached.clean_run(ids, [0, 3], late), full.clean_run(ids, [0, 3], late)
        assert a.acts.shape == b.acts.shape == (2, 8, 32)
        torch.testing.assert_close(a.acts, b.acts, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values([3], late[-2:]), b.values([3], late[-2:]))
