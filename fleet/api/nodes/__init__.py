"""Nodes, their GPUs and the engines every node installs, through the management API.

Its one reason to change: what an operator sees of a node and asks of it (cordon, drain,
notice, logs, its vLLM build, a GPU's fault cleared). ``serializers`` says how they read,
``filters`` how a list is narrowed, ``views`` the routes fleet/api/urls.py registers.
"""
