"""LabMemory (persistence.py): the lab as a scenario and the number its next consumer is
named by, saved when they change and read back; --fresh (clear) forgets both."""
import asyncio

import pytest

from consumers_app.lab.persistence import LabMemory
from consumers_app.lab.scenario import DEFAULT
from consumers_app.models import SavedLab

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_next_consumer_number_is_saved_and_read_back():
    memory = LabMemory(name="memory-test")
    assert asyncio.run(memory.save(DEFAULT, next_client=7))
    assert not asyncio.run(memory.save(DEFAULT, next_client=7)), "nothing changed: no write"
    assert asyncio.run(memory.save(DEFAULT, next_client=8)), "the number alone changed: written"

    again = LabMemory(name="memory-test")
    assert again.next_client == 1
    assert asyncio.run(again.load()) == DEFAULT
    assert again.next_client == 8
    assert not asyncio.run(again.save(DEFAULT, next_client=8)), "as loaded: no write"

    asyncio.run(again.clear())
    assert again.next_client == 1 and not SavedLab.objects.filter(name="memory-test").exists()


def test_a_row_saved_before_the_number_existed_starts_at_one():
    SavedLab.objects.create(name="memory-old", scenario=DEFAULT.to_dict())
    memory = LabMemory(name="memory-old")
    assert asyncio.run(memory.load()) == DEFAULT
    assert memory.next_client == 1
