"""Pydantic models the client-library tests share (tests/unit/test_client_library_requests.py and
tests/integration/test_client_libraries.py): a nested model, whose JSON schema has $defs and a $ref
as most real ones do."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Field(max_length=20)


class Person(BaseModel):
    """A nested model: its JSON schema has $defs and a $ref, as most real ones do."""

    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=150)
    address: Address
