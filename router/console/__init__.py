"""The browser side: pages, admin API, OpenAPI document, and the static files in web/."""
