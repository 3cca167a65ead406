import pytest


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Generated datasets and mirrors go to the test's own folder."""
    monkeypatch.setenv("TCSPARSE_CACHE", str(tmp_path / "cache"))
