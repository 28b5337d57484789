"""Lesson 01's plots tell sizes truly and its widgets' controls do what they show."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from lessonlib import costmodel as cm  # noqa: E402
from lessonlib.viz import scale  # noqa: E402


def test_memory_wall_bars_are_true_sizes_on_a_linear_axis():
    ax = scale.memory_wall("gpt3-175B")
    assert ax.get_xscale() == "linear"
    widths = {label.get_text(): bar.get_width()
              for label, bar in zip(ax.get_yticklabels(), ax.patches)}
    parts = scale.one_gpu_memory(cm.MODELS["gpt3-175B"])
    assert widths["optimizer"] == pytest.approx(parts["optimizer"] / 1e9)
    assert widths["optimizer"] > 5 * widths["weights"]          # 12 bytes against 2
    assert widths["total on one GPU"] == pytest.approx(sum(parts[p] for p in scale.PARTS) / 1e9)


def test_gpus_of_the_same_size_share_one_label():
    labels = [t.get_text() for t in scale.memory_wall("gpt2-small").get_yticklabels()]
    gpu_labels = labels[len(scale.PARTS) + 1:]
    assert len(gpu_labels) == len(set(round(g.memory_bytes / 1e9) for g in cm.GPUS.values()))
    assert "A100-80GB = H100-SXM5" in gpu_labels


def test_layer_and_hidden_sliders_follow_the_preset_and_unlock_for_custom():
    box = scale.memory_widget()
    preset, layers, hidden = box.children[0].children[:3]
    assert layers.disabled and hidden.disabled
    assert (layers.value, hidden.value) == (cm.MODELS["gpt3-175B"].L, cm.MODELS["gpt3-175B"].h)
    preset.value = "gpt2-xl"
    assert (layers.value, hidden.value) == (cm.MODELS["gpt2-xl"].L, cm.MODELS["gpt2-xl"].h)
    preset.value = "custom"
    assert not layers.disabled and not hidden.disabled
    before = box.children[1].outputs[0]["data"]["image/png"]
    layers.value = 2
    assert box.children[1].outputs[0]["data"]["image/png"] != before   # the slider redraws


def test_time_widget_starts_exactly_on_the_values_it_is_given():
    """No slider step moves the start: 01's prose says 288 years, and so does the plot."""
    v100 = cm.get_gpu("V100").peak_flops
    efficiency = cm.rate_for_time(cm.training_flops(175e9, 300e9), 1,
                                  288 * cm.SECONDS_PER_YEAR) / v100
    box = scale.time_widget(efficiency)
    sliders = {c.description: c for c in box.children[0].children}
    assert (sliders["params_billion"].value, sliders["tokens_billion"].value) == (175, 300)
    assert sliders["efficiency"].value == efficiency
    assert 0.3 in [v for _, v in sliders["efficiency"].options]    # "move it to 30 %", says 01
    title = box.children[1].outputs[-1]["text"]
    assert title.startswith("175 B parameters, 300 B tokens, 34.7 TFLOP/s per GPU (27.7% of peak)")
    assert title.endswith(": 1 x V100-SXM2-32GB: 288 years\n")
    sliders["tokens_billion"].value = 2000
    assert "2000 B tokens" in box.children[1].outputs[-1]["text"]
    assert [v for _, v in scale.choices(175, 0.1, 2000, str)][8:14] == [50, 100, 175, 200, 500,
                                                                       1000]
