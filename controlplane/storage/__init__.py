"""Platform object storage: one `ObjectStore` seam, a filesystem and an S3 backend (design 9.22).

Provider outputs are copied here before a task may succeed; see `base` for the contract.
"""

from controlplane.storage.base import (
    InvalidKeyError,
    ObjectNotFoundError,
    ObjectStore,
    PresigningStore,
    PutSource,
    StorageError,
    StoredObject,
    validate_key,
)
from controlplane.storage.factory import object_store_from_url
from controlplane.storage.filesystem import FilesystemObjectStore
from controlplane.storage.s3 import S3ObjectStore

__all__ = [
    "FilesystemObjectStore",
    "InvalidKeyError",
    "ObjectNotFoundError",
    "ObjectStore",
    "PresigningStore",
    "PutSource",
    "S3ObjectStore",
    "StorageError",
    "StoredObject",
    "object_store_from_url",
    "validate_key",
]
