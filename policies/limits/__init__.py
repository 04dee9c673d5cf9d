"""What a key may take: per-key limits and quotas, and fair shares between tenants."""
