"""Fixtures for the ObjectStore suite: the session's moto S3 server."""

from tests.integration.storage.moto_s3 import moto_s3

__all__ = ["moto_s3"]
