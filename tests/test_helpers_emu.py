"""The emulator builder's refusal of a source tree that lacks the kernel headers it needs."""

import pytest

import helpers_emu


def test_named_source_root_without_csrc_is_refused_by_its_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TSCALE_EMU_SOURCE_ROOT", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"TSCALE_EMU_SOURCE_ROOT=.*no csrc/attention there"):
        helpers_emu.build_emulator("unused", "attention_emu/attention_emu.cpp", ["csrc/attention"])


def test_repository_without_csrc_is_refused_without_naming_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("TSCALE_EMU_SOURCE_ROOT", raising=False)
    monkeypatch.setattr(helpers_emu, "REPO", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"^the repository at .*no csrc/attention there") as caught:
        helpers_emu.build_emulator("unused", "attention_emu/attention_emu.cpp", ["csrc/attention"])
    assert "TSCALE_EMU_SOURCE_ROOT" not in str(caught.value)
