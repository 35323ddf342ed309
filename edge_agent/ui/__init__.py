"""The Textual app. The only package that imports textual; it consumes agent events and never
calls the model on the UI thread (see ``chat_screen.ChatScreen.run_ask``)."""
