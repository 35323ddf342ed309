"""Chats: the store and its exports, a chat's context continuity, the pending turn, crops, locks."""
