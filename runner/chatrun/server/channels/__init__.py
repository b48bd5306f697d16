"""Channels: the messaging platforms a bot answers on, declared under `channels:` in the bot
(docs/channels.md). One module per platform (base.ChannelKind: check a delivery, read its user
messages, send a reply); door.py is the flow they share: a webhook route per bot and kind,
one turn per message run once, replies through the outbox after the commit."""
