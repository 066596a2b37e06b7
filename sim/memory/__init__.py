"""GPU memory as plain state: paged KV blocks with a prefix cache, and adapter slots."""
