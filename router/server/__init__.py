"""The HTTP server under the gateway: connection limits, GatewayRunner and its handler."""
