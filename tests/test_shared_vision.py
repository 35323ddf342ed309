"""One vision tower for two models loaded with the same mmproj file (issue 20: the prophet beside the
agent must not hold a second 0.42 GB copy of the projector at the 2B size).

Real llama.cpp on the tiny Qwen3-VL pair (agent + prophet, same tokenizer, F32 weights and KV):
- a prophet loaded with ``share_vision_with=agent`` uses the agent's mtmd context and counts no
  mmproj bytes of its own; other image-token limits (another projector set-up) load their own;
- exactness: the prophet reading an image through the shared tower (encoding it itself) gives the
  logits of the same prophet loaded with its own tower;
- the tower outlives whichever model closes first and is freed by the last;
- two models encoding different images through one tower at once get the embeddings each gets alone
  (the tower's lock keeps mtmd's output buffer to one encode at a time).
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image

KW = dict(n_ctx=1024, n_threads=1, n_threads_batch=1, kv_type="f32")


def png(color: tuple[int, int, int], size: tuple[int, int] = (96, 64)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


def read_image(model, image: bytes, *, clear: bool = True) -> np.ndarray:
    """Logits after a user turn holding ``image`` (``clear``: the vision cache cleared first, so this
    model encodes it)."""
    from edge_agent.runtime import vision

    if clear:
        vision.clear_cache()
    s = model.session()
    s.append_text("<|im_start|>user\n")
    s.append_image(image)
    s.append_text("What is in the picture?<|im_end|>\n<|im_start|>assistant\n")
    return np.array(s.next_logits(), dtype=np.float64)


@pytest.fixture(scope="module")
def agent(tiny_models):
    from edge_agent.runtime import Model

    m = Model.load(tiny_models["text"], tiny_models["mmproj"], **KW)
    yield m
    m.close()


def test_a_prophet_beside_the_agent_uses_its_vision_tower(agent, tiny_models):
    from edge_agent.runtime import Model

    tower = agent.handle.vision
    assert tower is not None and tower.holders == 1
    with Model.load(tiny_models["prophet"], tiny_models["mmproj"], share_vision_with=agent, **KW) as prophet:
        assert prophet.handle.vision is tower and tower.holders == 2
        assert prophet.handle.mtmd == agent.handle.mtmd and prophet.has_vision and prophet.vision_shared
        assert prophet.memory_bytes["mmproj"] == 0 and agent.memory_bytes["mmproj"] > 0
        assert not agent.vision_shared
    assert tower.holders == 1 and tower.ptr  # the prophet closed: the agent's tower stays


def test_other_image_limits_load_their_own_tower(agent, tiny_models):
    """the key is the mmproj file *and* mtmd's image-token limits: a prophet set up otherwise must not
    tokenize images with the agent's limits."""
    from edge_agent.runtime import Model

    with Model.load(tiny_models["prophet"], tiny_models["mmproj"], share_vision_with=agent,
                    image_max_tokens=64, **KW) as prophet:
        assert prophet.handle.vision is not agent.handle.vision and not prophet.vision_shared
        assert prophet.memory_bytes["mmproj"] == agent.memory_bytes["mmproj"] > 0
    with Model.load(tiny_models["prophet"], None, share_vision_with=agent, **KW) as text_only:
        assert text_only.handle.vision is None and not text_only.has_vision


def test_reading_an_image_through_the_shared_tower_equals_the_prophets_own(agent, tiny_models):
    from edge_agent.runtime import Model

    img = png((30, 140, 200))
    with Model.load(tiny_models["prophet"], tiny_models["mmproj"], **KW) as own:
        ref = read_image(own, img)
        n_own = own.vision_encodes
    with Model.load(tiny_models["prophet"], tiny_models["mmproj"], share_vision_with=agent, **KW) as shared:
        got = read_image(shared, img)
        assert shared.vision_encodes == 1 and n_own == 1  # each encoded the image itself
    assert np.isfinite(ref).all()
    np.testing.assert_array_equal(got, ref)


def test_the_tower_outlives_the_model_that_loaded_it(tiny_models):
    from edge_agent.runtime import Model

    img = png((200, 180, 20))
    first = Model.load(tiny_models["text"], tiny_models["mmproj"], **KW)
    second = Model.load(tiny_models["prophet"], tiny_models["mmproj"], share_vision_with=first, **KW)
    tower = first.handle.vision
    try:
        with Model.load(tiny_models["prophet"], tiny_models["mmproj"], **KW) as own:
            ref = read_image(own, img)
        first.close()  # the loader goes first: the prophet still reads images
        assert tower.holders == 1 and tower.ptr
        np.testing.assert_array_equal(read_image(second, img), ref)
    finally:
        second.close()
        first.close()
    assert tower.holders == 0 and not tower.ptr  # the last holder freed it


def test_two_models_encoding_at_once_through_one_tower(agent, tiny_models):
    """the agent and the prophet encode two different images at the same moment: each then reads its
    image (from the embeddings encoded together) with the logits it gets alone."""
    from edge_agent.runtime import Model, vision

    imgs = [png((250, 10, 10), (128, 96)), png((10, 250, 10), (96, 128))]
    with Model.load(tiny_models["prophet"], tiny_models["mmproj"], share_vision_with=agent, **KW) as prophet:
        models = (agent, prophet)
        alone = [read_image(m, img) for m, img in zip(models, imgs, strict=True)]
        vision.clear_cache()
        n0 = vision.vision_encodes()
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def encode(model, img):
            try:
                barrier.wait()
                assert model.encode_image(img)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=encode, args=(m, img))
                   for m, img in zip(models, imgs, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and vision.vision_encodes() == n0 + 2
        for m, img, ref in zip(models, imgs, alone, strict=True):
            np.testing.assert_array_equal(read_image(m, img, clear=False), ref)
        assert vision.vision_encodes() == n0 + 2  # read from the embeddings encoded together
