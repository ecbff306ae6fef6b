"""Who is calling and what they may do: API keys (and the request's key), authentication,
admission (per-key buckets, tokens in flight), cache namespaces per key, the Host check
and trusted proxies."""
