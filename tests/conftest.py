from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Config and data go to a temporary folder, never the user's."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    for var in ("SPOC_VLLM_URL", "SPOC_DCGM_URL", "SPOC_API_KEY", "SPOC_PROMETHEUS_URL", "SPOC_CONFIG"):
        monkeypatch.delenv(var, raising=False)


def fixture_text(rel: str) -> str:
    return (FIXTURES / rel).read_text()
