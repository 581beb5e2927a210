"""Accounts documents in the database (design 9.11, 9.19.1, 9.25.5), and their mirror in
``provider_accounts``.

Versions and activations are `documents.Documents` over ``account_config_versions`` and
``account_config_activations`` (revision 0018), published, rolled back and audited exactly as
tenants documents are. `AccountSetting` is what an activation writes into a catalog account
row (through `SqlUnitOfWork.apply_account_settings`, in the activating unit).
"""

from __future__ import annotations

from controlplane.persistence.documents import Documents
from controlplane.persistence.models import account_config_activations as P
from controlplane.persistence.models import account_config_versions as V

DOCUMENTS = Documents(V, P, "account-config-publication")
