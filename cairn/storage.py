"""Artifact storage on an S3-compatible bucket (AWS S3, MinIO, Ceph …) via django-storages.

Chosen with ``CAIRN_ARTIFACT_STORAGE=s3`` (cairn.settings). The access key and secret key
are secret references (``env:NAME`` / ``file:NAME``, cairn.secrets), resolved when a
connection is made and never kept in settings; without references, boto3's own credential
chain applies (an instance role, for example). Cairn seals artifacts before they reach the
storage (checkpoints.artifact_sealing), so the bucket only ever holds ciphertext.
"""

from __future__ import annotations

import boto3
from storages.backends.s3 import S3Storage

from cairn.secrets import secret_resolve


class ArtifactS3Storage(S3Storage):
    def __init__(self, *, access_key_ref: str = "", secret_key_ref: str = "", **options):
        self.access_key_ref, self.secret_key_ref = access_key_ref, secret_key_ref
        super().__init__(**options)

    def _create_session(self) -> boto3.Session:
        if not (self.access_key_ref or self.secret_key_ref):
            return super()._create_session()
        return boto3.Session(
            aws_access_key_id=secret_resolve(self.access_key_ref),
            aws_secret_access_key=secret_resolve(self.secret_key_ref),
        )
