"""Multi-Conv DAPO advantages against hand-computed values. Run: .venv/bin/pytest tests/test_rl_advantages.py"""

from __future__ import annotations

import pytest
import torch

from memagent.rl.advantages import all_equal_groups, expand_to_conversations, group_advantages


def test_docstring_worked_example():
    adv = group_advantages([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]
    conv = expand_to_conversations(adv, [0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3])
    assert conv.tolist() == [0.5] * 5 + [-0.5] * 2 + [0.0] * 4


def test_five_and_two_conversation_trajectories_share_one_advantage_each():
    # Group of 3: traj 0 read 4 chunks (5 convs), traj 1 read 1 chunk (2 convs), traj 2 (3 convs).
    rewards, groups = [1.0, 1.0, 0.0], [0, 0, 0]
    adv = group_advantages(rewards, groups)
    assert adv.tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3])
    conv_traj = [0] * 5 + [1] * 2 + [2] * 3
    per_conv = expand_to_conversations(adv, conv_traj)
    assert per_conv[:5].tolist() == pytest.approx([1 / 3] * 5)
    assert per_conv[5:7].tolist() == pytest.approx([1 / 3] * 2)  # same as the 5-conv trajectory
    # Normalising after expansion would weight each trajectory by its conversation count.
    naive = torch.tensor([rewards[i] for i in conv_traj])
    assert (naive - naive.mean())[0].item() == pytest.approx(0.3)  # mean 0.7, not 2/3


def test_normalise_before_expanding_is_symmetric_in_conversation_counts():
    # The right trajectory has 5 convs (4 chunks + answer), the wrong one 2.
    adv = group_advantages([1.0, 0.0], [0, 0])
    per_conv = expand_to_conversations(adv, [0] * 5 + [1] * 2)
    assert per_conv.tolist() == [0.5] * 5 + [-0.5] * 2  # not +2/7 and -5/7


def test_all_equal_groups_give_zero_with_and_without_std():
    for std in (False, True):
        adv = group_advantages([1.0, 1.0, 1.0, 0.0, 0.0], [3, 3, 3, 9, 9], std_normalize=std)
        assert adv.tolist() == [0.0] * 5
        assert torch.isfinite(adv).all()


def test_std_normalisation_by_hand():
    # mean 0.25; unbiased std = sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    adv = group_advantages([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0], std_normalize=True, eps=0.0)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    assert group_advantages([1.0, 0.0, 0.0, 0.0], [0] * 4).tolist() == [0.75, -0.25, -0.25, -0.25]


def test_groups_in_any_order_and_any_ids():
    adv = group_advantages([2.0, 5.0, 4.0, 1.0], [42, 7, 42, 7])
    assert adv.tolist() == [-1.0, 2.0, 1.0, -2.0]


def test_singleton_group_keeps_raw_reward_as_verl():
    assert group_advantages([1.0, 0.0, 1.0], [0, 1, 1]).tolist() == [1.0, -0.5, 0.5]


def test_bad_shapes_and_indices_raise():
    with pytest.raises(ValueError):
        group_advantages([1.0, 0.0], [0])
    with pytest.raises(ValueError):
        expand_to_conversations(torch.tensor([0.1, 0.2]), [0, 2])


def test_all_equal_group_ids():
    assert all_equal_groups([1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [7, 7, 8, 8, 9, 9]) == {7, 9}
