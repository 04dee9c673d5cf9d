"""A fleet that grows and shrinks (#34): what the gateway tells an autoscaler."""
