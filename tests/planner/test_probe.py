def test_x():
    assert 1
