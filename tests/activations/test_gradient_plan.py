"""Attribution's memory plan (issue 41, item 1): a backward pass keeps every block's saved
tensors, MXFP4 weights are refused (forward-only kernels), and a sequence whose backward pass
does not fit a (fake, small) device is refused with its figures, on a CPU."""

from __future__ import annotations

import re

import pytest
from goalprobe.activations.plan import (
    GPT_OSS_20B,
    ModelShape,
    activation_bytes,
    backward_bytes,
    plan_attribution,
)

GB = 1e9


def test_the_backward_term_keeps_every_block():
    forward = activation_bytes(GPT_OSS_20B, 1, 1_500)
    backward = backward_bytes(GPT_OSS_20B, 1_500)
    # 24 blocks' saved tensors: far more than the forward peak of one block
    assert 10 * forward < backward < 30 * forward
    assert backward / GB == pytest.approx(16.3, abs=0.1)
    # a one-block model: roughly the forward peak twice over
    one = ModelShape(1, 64, 4, 2, 16, 4, 2, 64, 100)
    assert 1.2 < backward_bytes(one, 400) / activation_bytes(one, 1, 400) < 3.0
    # eager attention keeps T x (T + 1) scores per head and block: quadratic; flex: linear
    assert backward_bytes(GPT_OSS_20B, 8_000) / backward_bytes(GPT_OSS_20B, 4_000) > 3.0
    flex = backward_bytes(GPT_OSS_20B, 8_000, attention="flex_attention")
    assert flex / backward_bytes(GPT_OSS_20B, 4_000, attention="flex_attention") < 2.1
    with pytest.raises(ValueError, match="attention implementation"):
        backward_bytes(GPT_OSS_20B, 100, attention="sdpa")


def test_gpt_oss_20b_fits_an_h200_in_bf16():
    plan = plan_attribution([1_200, 1_500], GPT_OSS_20B, memory_bytes=141 * GB)
    assert plan.fits and plan.reason == ""
    assert plan.weights_gb == pytest.approx(41.8, abs=0.1)
    assert plan.peak_gb == pytest.approx(58.1, abs=0.2)


def test_mxfp4_weights_are_refused():
    plan = plan_attribution([1_500], GPT_OSS_20B, memory_bytes=141 * GB, mxfp4=True)
    assert not plan.fits
    assert re.search("forward-only.*bf16.*41.8 GB", plan.reason)


def test_a_backward_pass_that_does_not_fit_a_small_device_is_refused_with_its_figures():
    # an 80 GB device: 24.7 GB left after the bf16 weights; 3,000 tokens need 48.2 GB
    plan = plan_attribution([400, 3_000], GPT_OSS_20B, memory_bytes=80 * GB)
    assert not plan.fits
    message = plan.reason
    assert "3,000 tokens" in message and "48.2 GB" in message and "24.7 GB" in message
    assert "flex attention would need 17.8 GB" in message
    # the same sequences one step shorter fit
    assert plan_attribution([400, 1_500], GPT_OSS_20B, memory_bytes=80 * GB).fits
