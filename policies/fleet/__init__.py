"""A fleet that grows and shrinks (#34): how many replicas a backend needs."""
