import pytest


@pytest.fixture(scope="module")
def sentences(sst2_dev):
    """SST-2's dev sentences: real text to calibrate on and to compare int8 with fp32 on."""
    return [text for text, _ in sst2_dev]
