"""The texts of chatrun's own web page (its Send button, its notices, the cards of pending
items) in a few locales, and how a bot's catalog overrides them (docs/i18n.md, "The page").
The conversation's own texts are kept here with them: `fallback` (what the user gets when the
model has nothing to say and the bot declares no `fallback:`; engine/turn.py), `language_refused`
(a `languages:` guardrail's refusal; engine/guardrails.py), and what the user
is told while a person decides (`tell_*`, `still_waiting`, ...; engine/pausing.py, engine/waiting.py).
Every text chatrun itself shows a user has a key here, in every built-in locale.

The page shows its controls in the session's locale: chatrun's built-in text of each key
below, replaced by the bot's own `page.<key>` text where its catalog has one (a bot can
say "Order" instead of "Send", or give a locale chatrun has no texts for). `{name}` is filled
by the page. A bot without `locales:` gets the English texts.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

from chatrun.events import MODEL_FAILED_TEXT, TURN_FAILED_TEXT

if TYPE_CHECKING:
    from chatrun.definition.catalogs import Catalogs

# What the data (events' `name`, a resolution's `by`, /typing) says for an operator with no name:
# a stable value programs may compare, never shown to a user (they read `operator_unnamed`, or
# a sentence's `<key>_unnamed`, in their locale: about_operator).
UNNAMED_OPERATOR = "operator"
PREFIX = "page."  # a bot's catalog key `page.send` overrides the page's `send`

BUILTIN: dict[str, dict[str, str]] = {
    "en": {
        "send": "Send",
        "placeholder": "Type a message…",
        "message_label": "Message",
        "breadcrumb": "Where you are",
        "reset": "Reset",
        "reset_hint": "End this conversation and start a new one",
        "inspector": "Inspector",
        "hello": "Say hello to {bot}.",
        "thinking": "Thinking…",
        "now_in": "now in {route}",
        "ended": "This conversation has ended.",
        "ended_placeholder": "This conversation has ended",
        "start_new": "Start a new conversation",
        "talking_to": "You are talking to {name}",
        "operator_joined": "{name} joined the conversation",
        "operator_left": "{name} left the conversation",
        "operator_typing": "{name} is typing…",
        # An operator with no name (a server without --auth, a principal without a display name):
        # whole sentences of their own, so each language says them in its grammar.
        "operator_unnamed": "an operator",
        "talking_to_unnamed": "You are talking to an operator",
        "operator_joined_unnamed": "An operator joined the conversation",
        "operator_left_unnamed": "The operator left the conversation",
        "operator_typing_unnamed": "An operator is typing…",
        # The phone's welcome greeting (Twilio ConversationRelay's welcomeGreeting): none built in;
        # a bot's `page.phone_greeting` in its first locale, else the channel's `greeting`.
        "phone_greeting": "",
        "no_model": "No model is configured, so the bot cannot answer.",
        "tell_approval": "Your request is waiting for approval.",
        "tell_question": "Your request is waiting for an answer.",
        "tell_takeover": "A person is looking after your conversation.",
        "still_waiting": "Still waiting: {text}",
        "answer_unfit": "That answer does not fit: {problem}. {text}",
        "handover": "Connecting you with a person.",
        "reply_approve_reject": "Reply {approve} or {reject}.",
        "reply_choices": "Reply with one of: {choices}.",
        "passed_on": "Your message was passed on to {name}; their answer will appear here.",
        "passed_on_waiting": "Your message was passed on; a colleague will answer here shortly.",
        "the_operator": "the operator",
        "fallback": "Sorry, I have no answer to that. Could you say it another way?",
        "language_refused": "Sorry, I can only help in: {languages}.",
        "sources": "Sources",
        "connecting": "connecting…",
        "connected": "connected",
        "reconnecting": "reconnecting…",
        "unreachable": "server unreachable",
        "kind_approval": "Approval",
        "kind_question": "Question",
        "kind_takeover": "Operator",
        "approve": "Approve",
        "reject": "Reject",
        "answer": "Send",
        "widget_open": "Open chat: {title}",
        "widget_close": "Close chat",
        "widget_unread": "{count} unread",
        "yes": "Yes",
        "no": "No",
        "waiting_approval": "Waiting for approval…",
        "waiting_answer": "Waiting for an answer…",
        "waiting_operator": "Waiting for an operator…",
        "approved": "Approved",
        "edited": "Approved with changes",
        "rejected": "Rejected",
        "timed_out": "Timed out",
        "answered": "Answered",
        "released": "Released",
        "taken": "Taken over",
        "by": "by {name}",
        "held_note": "applies when the conversation is released",
        "change_arg": "Change {name}",
        "reason_optional": "Reason (optional; the bot is told)",
        "attach": "Attach files",
        "attach_hint": "Attach files (or paste, or drop them on the chat)",
        "drop_hint": "Drop files to attach them",
        "attach_tray": "Files to send",
        "attach_limits": "Files per message: up to {count}, {size} each: {kinds}",
        "remove_file": "Remove {name}",
        "file": "file",
        "image": "image",
        "image_gone": "{name} (no longer available)",
        "size_bytes_one": "{n} byte",
        "size_bytes_other": "{n} bytes",
        "size_kb": "{n} kB",
        "size_mb": "{n} MB",
        "attach_none": "This part of the conversation ({route}) takes no files.",
        "attach_removed": "This part of the conversation ({route}) takes no files; the files were removed.",
        "attach_count": "Files per message: at most {count} (attachments.max_count); {name} was not added.",
        "attach_kind": "{name} is {type}; this chat takes {kinds} (attachments.kinds).",
        "attach_kind_unknown": "{name} is of an unknown type; this chat takes {kinds} (attachments.kinds).",
        "attach_size": "{name} is {size}, over this chat's limit of {limit} per file (attachments.max_bytes).",
        "not_sent": "Not sent: {reason}",
        "unauthorized_user": "This chat cannot go on: its access has expired or was refused. Reload the page to continue.",
        "lost_turn": "The connection was lost before the reply: your message is back in the box, to send again.",
        "failed_turn": "Your message is back in the box, to send again.",
        # After a failed turn in which tools with an outside effect ran: the text is not given back.
        "failed_kept_out": "Your message is not back in the box: sending it again would run {tools} again.",
        # A failed turn in which a tool that may change something ran (engine/session.py _failed_text).
        "turn_failed": TURN_FAILED_TEXT,
        "model_failed": MODEL_FAILED_TEXT,
        "failed_after_effect": "Sorry, your last message could not be handled and was not saved, but {tools} ran: please check what it did before asking again.",
        # A message larger than the route's whole memory (engine/turn.py sent_whole): no model reads it.
        # A route whose knowledge index cannot be built or read (chatrun.knowledge): no answer without it.
        "knowledge_unavailable": "Sorry, I cannot search my documents right now, so I will not guess an answer. Nothing of your message was kept; please try again later.",
        "user_budget_spent": "Sorry, you have used up what this assistant can spend on you for now. Nothing of your last message was kept; your budget renews at {renews}.",
        "session_budget_spent": "Sorry, this conversation has used up what this assistant can spend on it, so it cannot go on. Nothing of your last message was kept.",
        "message_too_long": "Sorry, your message is too long for me to read. Nothing of it was kept; please shorten it or send it in parts.",
        "unreadable": "cannot read {name}",
        # A messaging platform's user whose files are not taken (server/channels/door.py): no turn runs.
        "channel_no_files": "Sorry, I cannot take files here. Please send your message as text.",
        "channel_file_refused": "Sorry, I cannot take that file. I take {kinds} files of up to {size}, "
                                "at most {count} per message.",
        "channel_file_unreadable": "Sorry, I could not read your file. Please send it again.",
        # A messaging platform's user who pressed a button of a question answered before: nothing is decided.
        "channel_answered": "That question was answered already, so the button did nothing. "
                            "Please answer the latest question.",
        # A messaging platform's user whose new conversation the server refused: they own
        # --max-sessions-per-principal sessions already (`limit`). Nothing is kept.
        "channel_too_many_sessions": "Sorry, you have as many open conversations with this assistant as it "
                                     "allows ({limit}), so I cannot start a new one. Please go on in one you "
                                     "already have; nothing of this message was kept.",
        # A messaging platform's user who edited a message sent before: no turn runs (edits are not read).
        "channel_edited": "I do not read edited messages, so your edit changed nothing. "
                          "Please send the message again.",
        # A messaging platform's user whose message is over the server's --max-message-chars: no turn runs.
        "channel_too_long_one": "Sorry, your message is too long: I take messages of up to {limit} character. "
                                "Please send a shorter one.",
        "channel_too_long_other": "Sorry, your message is too long: I take messages of up to {limit} characters. "
                                  "Please send a shorter one.",
        "phone_too_long": "That was too long for me; please say it in fewer words.",
        "phone_choices": "Say or press {choices}.",
        "phone_choice": "{digit} for {label}",
        "channel_list_button": "Choose",
        "channel_list_title": "Choose one",
        # The end-user page (/chat/{bot}): its title, greeting and controls.
        "chat_title": "Chat",
        "hello_user": "How can I help you?",
        "no_model_user": "This chat cannot answer yet: it has not been connected to its assistant. "
                         "Please try again later or contact the site's owner.",
        "copy": "Copy",
        "copied": "Copied",
        "copy_message": "Copy message",
        "code": "code",
        "to_bottom": "Scroll to the latest message",
        "dark_mode": "Dark mode",
        # turn_controls.js: Stop, and thumbs up/down with an optional comment
        "stop": "Stop",
        "rate_up": "Good reply",
        "rate_down": "Bad reply",
        "feedback_placeholder": "What was wrong? (optional)",
        "feedback_send": "Send feedback",
        "feedback_thanks": "Thanks for your feedback",
        # The page's memory control (user_memory.js; docs/memory.md, "User memory").
        "memory_button": "What {bot} remembers about you",
        "memory_title": "What {bot} remembers about you",
        "memory_empty": "{bot} remembers nothing about you.",
        "memory_summary": "From your earlier conversations",
        "memory_forget": "Forget",
        "memory_forget_label": "Forget: {fact}",
        "memory_erase_all": "Erase everything",
        "memory_erase_confirm": "Erase everything {bot} remembers about you? This cannot be undone.",
        "memory_erase_yes": "Erase",
        "memory_cancel": "Cancel",
        "memory_erased": "Erased.",
        "memory_close": "Close",
        "memory_failed": "That did not work: {problem}",
        # The operator page (/operator, operator.js): the inbox and the conversation view.
        "op_inbox": "Inbox",
        "op_count_label": "conversations waiting for a person",
        "op_notify": "Notify me",
        "op_notifying": "Notifying",
        "op_notify_none": "No notifications here",
        "op_notify_blocked": "Notifications blocked",
        "op_notify_blocked_short": "Blocked",
        "op_sound": "Sound",
        "op_live": "live",
        "op_unauthorized": "unauthorized",
        "op_waiting": "Waiting",
        "op_kind": "Kind",
        "op_kind_all": "all",
        "op_kind_approvals": "approvals",
        "op_kind_questions": "questions",
        "op_kind_takeovers": "takeovers",
        "op_conversation": "Conversation",
        "op_pick": "Pick a conversation on the left.",
        "op_refused": "This page is for operators: open it with ?token=YOUR_TOKEN at the end of its address, "
                      "a token of the server's --auth file with the role operators. The server said: {problem}",
        "op_visitor": "Visitor {id}",
        "op_nobody": "Nobody is waiting.",
        "op_more": "More waiting conversations",
        "op_chip_approval": "approval · {waited}",
        "op_chip_question": "question · {waited}",
        "op_chip_takeover": "takeover · {waited}",
        "op_with": "with {name}",
        "op_you": "You",
        "op_note_waiting": "{name} · waiting",
        "op_note_more": "{name} and {count} more · waiting",
        "op_back": "‹ List",
        "op_on_route": "on {route}",
        "op_turns_one": "{n} turn",
        "op_turns_other": "{n} turns",
        "op_release_to": "Release to route",
        "op_release_back": "back to where it was",
        "op_release_route": "to {route}",
        "op_release": "Release",
        "op_details": "Details",
        "op_held_by": "{name} has this conversation (since {ago}): the bot is silent.",
        "op_take_over": "Take over",
        "op_take_from": "Take over from {name}",
        "op_asked_person": "The user asked for a person: {ask}",
        "op_bot_answers": "The bot answers until you take over.",
        "op_you_have": "You have this conversation (since {ago}): the bot is silent.",
        "op_placeholder": "Type as the operator…",
        "op_message_label": "Operator message",
        "op_canned": "Canned replies",
        "op_the_user": "The user",
        "op_no_turns": "No turns yet.",
        "op_from": "{name} · operator",
        "op_waiting_item": "waiting ({kind} {id}): {ask}",
        "op_spoke": "operator spoke",
        "op_gone": "This conversation no longer exists.",
    },
    "de": {
        "send": "Senden",
        "placeholder": "Nachricht eingeben…",
        "message_label": "Nachricht",
        "breadcrumb": "Wo Sie gerade sind",
        "reset": "Neu starten",
        "reset_hint": "Dieses Gespräch beenden und ein neues beginnen",
        "inspector": "Inspektor",
        "hello": "Schreiben Sie {bot} eine Nachricht.",
        "thinking": "Einen Moment…",
        "now_in": "jetzt bei {route}",
        "ended": "Dieses Gespräch ist beendet.",
        "ended_placeholder": "Dieses Gespräch ist beendet",
        "start_new": "Neues Gespräch beginnen",
        "talking_to": "Sie sprechen mit {name}",
        "operator_joined": "{name} ist dem Gespräch beigetreten",
        "operator_left": "{name} hat das Gespräch verlassen",
        "operator_typing": "{name} schreibt…",
        "operator_unnamed": "Mitarbeiter",
        "talking_to_unnamed": "Sie sprechen mit einem Mitarbeiter",
        "operator_joined_unnamed": "Ein Mitarbeiter ist dem Gespräch beigetreten",
        "operator_left_unnamed": "Der Mitarbeiter hat das Gespräch verlassen",
        "operator_typing_unnamed": "Ein Mitarbeiter schreibt…",
        "phone_greeting": "",
        "no_model": "Es ist kein Modell eingerichtet, daher kann der Bot nicht antworten.",
        "tell_approval": "Ihre Anfrage wartet auf eine Genehmigung.",
        "tell_question": "Ihre Anfrage wartet auf eine Antwort.",
        "tell_takeover": "Ein Mitarbeiter kümmert sich um Ihr Gespräch.",
        "still_waiting": "Es wird noch gewartet: {text}",
        "answer_unfit": "Diese Antwort passt nicht: {problem}. {text}",
        "handover": "Sie werden mit einem Mitarbeiter verbunden.",
        "reply_approve_reject": "Antworten Sie mit {approve} oder {reject}.",
        "reply_choices": "Antworten Sie mit einer dieser Möglichkeiten: {choices}.",
        "passed_on": "Ihre Nachricht wurde an {name} weitergeleitet; die Antwort erscheint hier.",
        "passed_on_waiting": "Ihre Nachricht wurde weitergeleitet; ein Mitarbeiter antwortet Ihnen gleich hier.",
        "the_operator": "den Mitarbeiter",
        "fallback": "Entschuldigung, darauf habe ich keine Antwort. Können Sie es anders formulieren?",
        "language_refused": "Entschuldigung, ich kann nur in diesen Sprachen helfen: {languages}.",
        "sources": "Quellen",
        "connecting": "Verbindung wird hergestellt…",
        "connected": "verbunden",
        "reconnecting": "Verbindung wird wiederhergestellt…",
        "unreachable": "Server nicht erreichbar",
        "kind_approval": "Genehmigung",
        "kind_question": "Frage",
        "kind_takeover": "Mitarbeiter",
        "approve": "Genehmigen",
        "reject": "Ablehnen",
        "answer": "Senden",
        "widget_open": "Chat öffnen: {title}",
        "widget_close": "Chat schließen",
        "widget_unread": "{count} ungelesen",
        "yes": "Ja",
        "no": "Nein",
        "waiting_approval": "Warten auf Genehmigung…",
        "waiting_answer": "Warten auf eine Antwort…",
        "waiting_operator": "Warten auf einen Mitarbeiter…",
        "approved": "Genehmigt",
        "edited": "Mit Änderungen genehmigt",
        "rejected": "Abgelehnt",
        "timed_out": "Zeit abgelaufen",
        "answered": "Beantwortet",
        "released": "Zurückgegeben",
        "taken": "Übernommen",
        "by": "von {name}",
        "held_note": "gilt, sobald das Gespräch zurückgegeben ist",
        "change_arg": "{name} ändern",
        "reason_optional": "Begründung (optional; der Bot erfährt sie)",
        "attach": "Dateien anhängen",
        "attach_hint": "Dateien anhängen (oder einfügen oder in den Chat ziehen)",
        "drop_hint": "Dateien hier ablegen, um sie anzuhängen",
        "attach_tray": "Zu sendende Dateien",
        "attach_limits": "Dateien pro Nachricht: bis zu {count}, je höchstens {size}: {kinds}",
        "remove_file": "{name} entfernen",
        "file": "Datei",
        "image": "Bild",
        "image_gone": "{name} (nicht mehr verfügbar)",
        "size_bytes_one": "{n} Byte",
        "size_bytes_other": "{n} Bytes",
        "size_kb": "{n} kB",
        "size_mb": "{n} MB",
        "attach_none": "In diesem Teil des Gesprächs ({route}) können keine Dateien angehängt werden.",
        "attach_removed": "In diesem Teil des Gesprächs ({route}) können keine Dateien angehängt werden; "
                          "die Dateien wurden entfernt.",
        "attach_count": "Dateien pro Nachricht: höchstens {count} (attachments.max_count); "
                        "{name} wurde nicht hinzugefügt.",
        "attach_kind": "{name} hat den Typ {type}; dieser Chat nimmt nur {kinds} an (attachments.kinds).",
        "attach_kind_unknown": "Der Typ von {name} ist unbekannt; dieser Chat nimmt nur {kinds} an "
                               "(attachments.kinds).",
        "attach_size": "{name} ist {size} groß und überschreitet die Grenze dieses Chats von {limit} pro Datei "
                       "(attachments.max_bytes).",
        "not_sent": "Nicht gesendet: {reason}",
        "unauthorized_user": "Dieser Chat kann nicht weitergehen: sein Zugang ist abgelaufen oder wurde abgelehnt. Laden Sie die Seite neu, um fortzufahren.",
        "lost_turn": "Die Verbindung brach vor der Antwort ab: Ihre Nachricht steht wieder im Eingabefeld, zum erneuten Senden.",
        "failed_turn": "Ihre Nachricht steht wieder im Eingabefeld, zum erneuten Senden.",
        "failed_kept_out": "Ihre Nachricht steht nicht wieder im Eingabefeld: Erneutes Senden würde {tools} noch einmal ausführen.",
        "turn_failed": "Entschuldigung, etwas ist schiefgegangen und Ihre letzte Nachricht konnte nicht bearbeitet werden. Nichts davon wurde gespeichert; bitte versuchen Sie es erneut.",
        "model_failed": "Entschuldigung, der Assistent kann gerade nicht antworten. Nichts von Ihrer letzten Nachricht wurde gespeichert; bitte versuchen Sie es erneut.",
        "failed_after_effect": "Entschuldigung, Ihre letzte Nachricht konnte nicht bearbeitet werden und wurde nicht gespeichert, aber {tools} wurde ausgeführt: Bitte prüfen Sie das Ergebnis, bevor Sie erneut fragen.",
        "knowledge_unavailable": "Entschuldigung, ich kann meine Dokumente gerade nicht durchsuchen und rate deshalb keine Antwort. Nichts von Ihrer Nachricht wurde gespeichert; bitte versuchen Sie es später noch einmal.",
        "user_budget_spent": "Entschuldigung, Ihr Kontingent bei diesem Assistenten ist vorerst aufgebraucht. Nichts von Ihrer letzten Nachricht wurde gespeichert; Ihr Kontingent erneuert sich am {renews}.",
        "session_budget_spent": "Entschuldigung, dieses Gespräch hat aufgebraucht, was dieser Assistent dafür ausgeben kann, und kann nicht weitergehen. Nichts von Ihrer letzten Nachricht wurde gespeichert.",
        "message_too_long": "Entschuldigung, Ihre Nachricht ist zu lang für mich. Nichts davon wurde gespeichert; bitte kürzen Sie sie oder senden Sie sie in Teilen.",
        "unreadable": "{name} kann nicht gelesen werden",
        "channel_no_files": "Leider kann ich hier keine Dateien annehmen. Bitte schreiben Sie Ihre Nachricht als Text.",
        "channel_file_refused": "Leider kann ich diese Datei nicht annehmen. Ich nehme {kinds}-Dateien bis {size} an, "
                                "höchstens {count} pro Nachricht.",
        "channel_file_unreadable": "Leider konnte ich Ihre Datei nicht lesen. Bitte senden Sie sie noch einmal.",
        "channel_answered": "Diese Frage wurde schon beantwortet, der Knopf hat nichts bewirkt. "
                            "Bitte beantworten Sie die letzte Frage.",
        "channel_too_many_sessions": "Entschuldigung, Sie haben so viele offene Unterhaltungen mit diesem Assistenten, wie er zulässt ({limit}), daher kann ich keine neue beginnen. Bitte setzen Sie eine bestehende fort; nichts von dieser Nachricht wurde gespeichert.",
        "channel_edited": "Bearbeitete Nachrichten lese ich nicht, Ihre Änderung hat nichts bewirkt. "
                          "Bitte senden Sie die Nachricht noch einmal.",
        "channel_too_long_one": "Leider ist Ihre Nachricht zu lang: Ich nehme Nachrichten mit bis zu {limit} Zeichen "
                                "an. Bitte senden Sie eine kürzere.",
        "channel_too_long_other": "Leider ist Ihre Nachricht zu lang: Ich nehme Nachrichten mit bis zu {limit} Zeichen "
                                  "an. Bitte senden Sie eine kürzere.",
        "phone_too_long": "Das war zu lang für mich; bitte sagen Sie es mit weniger Worten.",
        "phone_choices": "Sagen oder drücken Sie {choices}.",
        "phone_choice": "{digit} für {label}",
        "channel_list_button": "Auswählen",
        "channel_list_title": "Bitte wählen Sie",
        "chat_title": "Chat",
        "hello_user": "Wie kann ich Ihnen helfen?",
        "no_model_user": "Dieser Chat kann noch nicht antworten: Er ist noch nicht mit seinem Assistenten verbunden. "
                         "Bitte versuchen Sie es später noch einmal oder wenden Sie sich an den Betreiber der Website.",
        "copy": "Kopieren",
        "copied": "Kopiert",
        "copy_message": "Nachricht kopieren",
        "code": "Code",
        "to_bottom": "Zur neuesten Nachricht",
        "dark_mode": "Dunkler Modus",
        "stop": "Stoppen",
        "rate_up": "Gute Antwort",
        "rate_down": "Schlechte Antwort",
        "feedback_placeholder": "Was war falsch? (optional)",
        "feedback_send": "Feedback senden",
        "feedback_thanks": "Danke für Ihr Feedback",
        "memory_button": "Was {bot} über Sie weiß",
        "memory_title": "Was {bot} über Sie weiß",
        "memory_empty": "{bot} weiß nichts über Sie.",
        "memory_summary": "Aus Ihren früheren Gesprächen",
        "memory_forget": "Vergessen",
        "memory_forget_label": "Vergessen: {fact}",
        "memory_erase_all": "Alles löschen",
        "memory_erase_confirm": "Alles löschen, was {bot} über Sie weiß? Das lässt sich nicht rückgängig machen.",
        "memory_erase_yes": "Löschen",
        "memory_cancel": "Abbrechen",
        "memory_erased": "Gelöscht.",
        "memory_close": "Schließen",
        "memory_failed": "Das hat nicht geklappt: {problem}",
        "op_inbox": "Posteingang",
        "op_count_label": "Gespräche, die auf einen Mitarbeiter warten",
        "op_notify": "Benachrichtigen",
        "op_notifying": "Benachrichtigung an",
        "op_notify_none": "Keine Benachrichtigungen möglich",
        "op_notify_blocked": "Benachrichtigungen blockiert",
        "op_notify_blocked_short": "Blockiert",
        "op_sound": "Ton",
        "op_live": "live",
        "op_unauthorized": "nicht berechtigt",
        "op_waiting": "Wartend",
        "op_kind": "Art",
        "op_kind_all": "alle",
        "op_kind_approvals": "Genehmigungen",
        "op_kind_questions": "Fragen",
        "op_kind_takeovers": "Übernahmen",
        "op_conversation": "Gespräch",
        "op_pick": "Wählen Sie links ein Gespräch aus.",
        "op_refused": "Diese Seite ist für Mitarbeiter: Öffnen Sie sie mit ?token=IHR_TOKEN am Ende der Adresse, "
                      "einem Token aus der --auth-Datei des Servers mit der Rolle operators. Der Server meldete: {problem}",
        "op_visitor": "Besucher {id}",
        "op_nobody": "Niemand wartet.",
        "op_more": "Weitere wartende Gespräche",
        "op_chip_approval": "Genehmigung · {waited}",
        "op_chip_question": "Frage · {waited}",
        "op_chip_takeover": "Übernahme · {waited}",
        "op_with": "bei {name}",
        "op_you": "Sie",
        "op_note_waiting": "{name} · wartet",
        "op_note_more": "{name} und {count} weitere · warten",
        "op_back": "‹ Liste",
        "op_on_route": "bei {route}",
        "op_turns_one": "{n} Runde",
        "op_turns_other": "{n} Runden",
        "op_release_to": "Zurückgeben an Route",
        "op_release_back": "dorthin, wo es war",
        "op_release_route": "an {route}",
        "op_release": "Zurückgeben",
        "op_details": "Details",
        "op_held_by": "{name} betreut dieses Gespräch (seit {ago}): Der Bot schweigt.",
        "op_take_over": "Übernehmen",
        "op_take_from": "Von {name} übernehmen",
        "op_asked_person": "Der Nutzer hat nach einem Menschen gefragt: {ask}",
        "op_bot_answers": "Der Bot antwortet, bis Sie übernehmen.",
        "op_you_have": "Sie betreuen dieses Gespräch (seit {ago}): Der Bot schweigt.",
        "op_placeholder": "Als Mitarbeiter schreiben…",
        "op_message_label": "Nachricht des Mitarbeiters",
        "op_canned": "Textbausteine",
        "op_the_user": "Der Nutzer",
        "op_no_turns": "Noch keine Runden.",
        "op_from": "{name} · Mitarbeiter",
        "op_waiting_item": "wartet ({kind} {id}): {ask}",
        "op_spoke": "Mitarbeiter hat geschrieben",
        "op_gone": "Dieses Gespräch gibt es nicht mehr.",
    },
    "ar": {
        "send": "إرسال",
        "placeholder": "اكتب رسالة…",
        "message_label": "رسالة",
        "breadcrumb": "أين أنت الآن",
        "reset": "بدء من جديد",
        "reset_hint": "إنهاء هذه المحادثة وبدء محادثة جديدة",
        "inspector": "أداة الفحص",
        "hello": "ابدأ المحادثة مع {bot}.",
        "thinking": "لحظة من فضلك…",
        "now_in": "الآن في: {route}",
        "ended": "انتهت هذه المحادثة.",
        "ended_placeholder": "انتهت هذه المحادثة",
        "start_new": "بدء محادثة جديدة",
        "talking_to": "أنت تتحدث الآن مع {name}",
        "operator_joined": "انضم {name} إلى المحادثة",
        "operator_left": "غادر {name} المحادثة",
        "operator_typing": "{name} يكتب…",
        "operator_unnamed": "موظف",
        "talking_to_unnamed": "أنت تتحدث الآن مع أحد الموظفين",
        "operator_joined_unnamed": "انضم أحد الموظفين إلى المحادثة",
        "operator_left_unnamed": "غادر الموظف المحادثة",
        "operator_typing_unnamed": "أحد الموظفين يكتب…",
        "phone_greeting": "",
        "no_model": "لم يتم إعداد أي نموذج، لذلك لا يستطيع البوت الرد.",
        "tell_approval": "طلبك في انتظار الموافقة.",
        "tell_question": "طلبك في انتظار الإجابة.",
        "tell_takeover": "أحد الموظفين يتولى محادثتك الآن.",
        "still_waiting": "ما زلنا في الانتظار: {text}",
        "answer_unfit": "هذه الإجابة غير مناسبة: {problem}. {text}",
        "handover": "جارٍ توصيلك بأحد الموظفين.",
        "reply_approve_reject": "أجب بـ {approve} أو {reject}.",
        "reply_choices": "أجب بأحد الخيارات التالية: {choices}.",
        "passed_on": "تم تحويل رسالتك إلى {name}؛ سيظهر الرد هنا.",
        "passed_on_waiting": "تم تحويل رسالتك؛ سيرد عليك أحد الموظفين هنا قريبًا.",
        "the_operator": "الموظف",
        "fallback": "عذرًا، ليس لدي إجابة على ذلك. هل يمكنك قولها بطريقة أخرى؟",
        "language_refused": "عذرًا، يمكنني المساعدة بهذه اللغات فقط: {languages}.",
        "sources": "المصادر",
        "connecting": "جارٍ الاتصال…",
        "connected": "متصل",
        "reconnecting": "جارٍ إعادة الاتصال…",
        "unreachable": "تعذّر الوصول إلى الخادم",
        "kind_approval": "طلب موافقة",
        "kind_question": "سؤال",
        "kind_takeover": "موظف",
        "approve": "موافقة",
        "reject": "رفض",
        "answer": "إرسال",
        "widget_open": "فتح المحادثة: {title}",
        "widget_close": "إغلاق المحادثة",
        "widget_unread": "{count} غير مقروءة",
        "yes": "نعم",
        "no": "لا",
        "waiting_approval": "في انتظار الموافقة…",
        "waiting_answer": "في انتظار الإجابة…",
        "waiting_operator": "في انتظار أحد الموظفين…",
        "approved": "تمت الموافقة",
        "edited": "تمت الموافقة مع تعديلات",
        "rejected": "تم الرفض",
        "timed_out": "انتهت المهلة",
        "answered": "تمت الإجابة",
        "released": "أُعيدت المحادثة إلى البوت",
        "taken": "تولّى أحد الموظفين المحادثة",
        "by": "بواسطة {name}",
        "held_note": "يُطبَّق عند إعادة المحادثة إلى البوت",
        "change_arg": "تغيير {name}",
        "reason_optional": "السبب (اختياري؛ يُبلَّغ به البوت)",
        "attach": "إرفاق ملفات",
        "attach_hint": "إرفاق ملفات (أو الصقها، أو اسحبها وأفلتها في المحادثة)",
        "drop_hint": "أفلت الملفات هنا لإرفاقها",
        "attach_tray": "الملفات المراد إرسالها",
        "attach_limits": "الملفات في الرسالة الواحدة: حتى {count}، وبحد أقصى {size} لكل ملف: {kinds}",
        "remove_file": "إزالة {name}",
        "file": "ملف",
        "image": "صورة",
        "image_gone": "{name} (لم يعد متاحًا)",
        "size_bytes_one": "{n} بايت",
        "size_bytes_other": "{n} بايت",
        "size_kb": "{n} كيلوبايت",
        "size_mb": "{n} ميغابايت",
        "attach_none": "لا يقبل هذا الجزء من المحادثة ({route}) أي ملفات.",
        "attach_removed": "لا يقبل هذا الجزء من المحادثة ({route}) أي ملفات؛ لذلك أُزيلت الملفات.",
        "attach_count": "الحد الأقصى لعدد الملفات في الرسالة الواحدة: {count} (attachments.max_count)؛ "
                        "لم تتم إضافة {name}.",
        "attach_kind": "نوع {name} هو {type}؛ وهذه المحادثة لا تقبل إلا {kinds} (attachments.kinds).",
        "attach_kind_unknown": "نوع {name} غير معروف؛ وهذه المحادثة لا تقبل إلا {kinds} (attachments.kinds).",
        "attach_size": "حجم {name} هو {size}، وهذا يتجاوز الحد المسموح به في هذه المحادثة وهو {limit} لكل ملف "
                       "(attachments.max_bytes).",
        "not_sent": "لم يتم الإرسال: {reason}",
        "unauthorized_user": "لا يمكن متابعة هذه المحادثة: انتهت صلاحية الوصول إليها أو رُفض. أعد تحميل الصفحة للمتابعة.",
        "lost_turn": "انقطع الاتصال قبل الرد: رسالتك عادت إلى مربع الكتابة لإرسالها مرة أخرى.",
        "failed_turn": "رسالتك عادت إلى مربع الكتابة لإرسالها مرة أخرى.",
        "failed_kept_out": "لم تُعَد رسالتك إلى مربع الكتابة: إرسالها مرة أخرى سيُنفِّذ {tools} مجددًا.",
        "turn_failed": "عذرًا، حدث خطأ وتعذّرت معالجة رسالتك الأخيرة. لم يُحفظ شيء منها؛ يُرجى المحاولة مرة أخرى.",
        "model_failed": "عذرًا، لا يستطيع المساعد الرد الآن. لم يُحفظ شيء من رسالتك الأخيرة؛ يُرجى المحاولة مرة أخرى.",
        "failed_after_effect": "عذرًا، تعذّرت معالجة رسالتك الأخيرة ولم تُحفظ، لكن {tools} نُفِّذ: يُرجى التحقق مما حدث قبل أن تطلب مرة أخرى.",
        "knowledge_unavailable": "عذرًا، لا يمكنني البحث في مستنداتي الآن، لذلك لن أخمّن إجابة. لم يُحفظ شيء من رسالتك؛ يُرجى المحاولة مرة أخرى لاحقًا.",
        "user_budget_spent": "عذرًا، لقد استنفدت حصتك لدى هذا المساعد في الوقت الحالي. لم يُحفظ شيء من رسالتك الأخيرة؛ تتجدد حصتك في {renews}.",
        "session_budget_spent": "عذرًا، استنفدت هذه المحادثة ما يمكن لهذا المساعد إنفاقه عليها، فلا يمكن متابعتها. لم يُحفظ شيء من رسالتك الأخيرة.",
        "message_too_long": "عذرًا، رسالتك أطول من أن أقرأها. لم يُحفظ شيء منها؛ يُرجى اختصارها أو إرسالها على أجزاء.",
        "unreadable": "تعذّرت قراءة {name}",
        "channel_no_files": "عذرًا، لا يمكنني استلام الملفات هنا. يُرجى إرسال رسالتك نصًا.",
        "channel_file_refused": "عذرًا، لا يمكنني استلام هذا الملف. أستلم ملفات {kinds} بحجم أقصاه {size}، "
                                "وبحد أقصى {count} في الرسالة الواحدة.",
        "channel_file_unreadable": "عذرًا، تعذّرت قراءة ملفك. يُرجى إرساله مرة أخرى.",
        "channel_answered": "تمت الإجابة عن هذا السؤال من قبل، لذا لم يفعل الزر شيئًا. "
                            "يُرجى الإجابة عن السؤال الأخير.",
        "channel_too_many_sessions": "عذرًا، لديك من المحادثات المفتوحة مع هذا المساعد أقصى ما يسمح به ({limit})، لذا لا يمكنني بدء محادثة جديدة. يُرجى المتابعة في محادثة لديك بالفعل؛ لم يُحفظ شيء من هذه الرسالة.",
        "channel_edited": "لا أقرأ الرسائل المعدَّلة، لذا لم يغيّر تعديلك شيئًا. "
                          "يُرجى إرسال الرسالة مرة أخرى.",
        "channel_too_long_one": "عذرًا، رسالتك طويلة جدًا: الحد الأقصى لعدد الأحرف في الرسالة: {limit}. "
                                "يُرجى إرسال رسالة أقصر.",
        "channel_too_long_other": "عذرًا، رسالتك طويلة جدًا: الحد الأقصى لعدد الأحرف في الرسالة: {limit}. "
                                  "يُرجى إرسال رسالة أقصر.",
        "phone_too_long": "كان ذلك طويلًا جدًا بالنسبة لي؛ من فضلك قل ذلك بكلمات أقل.",
        "phone_choices": "قل أو اضغط {choices}.",
        "phone_choice": "{digit} لـ{label}",
        "channel_list_button": "اختر",
        "channel_list_title": "اختر واحدًا",
        "chat_title": "محادثة",
        "hello_user": "كيف يمكنني مساعدتك؟",
        "no_model_user": "لا تستطيع هذه المحادثة الرد بعد: لم يتم ربطها بمساعدها. "
                         "يُرجى المحاولة لاحقًا أو التواصل مع مالك الموقع.",
        "copy": "نسخ",
        "copied": "تم النسخ",
        "copy_message": "نسخ الرسالة",
        "code": "شيفرة",
        "to_bottom": "الانتقال إلى أحدث رسالة",
        "dark_mode": "الوضع الداكن",
        "stop": "إيقاف",
        "rate_up": "رد جيد",
        "rate_down": "رد سيئ",
        "feedback_placeholder": "ما الخطأ؟ (اختياري)",
        "feedback_send": "إرسال الملاحظات",
        "feedback_thanks": "شكرًا على ملاحظاتك",
        "memory_button": "ما يتذكره {bot} عنك",
        "memory_title": "ما يتذكره {bot} عنك",
        "memory_empty": "لا يتذكر {bot} شيئًا عنك.",
        "memory_summary": "من محادثاتك السابقة",
        "memory_forget": "حذف",
        "memory_forget_label": "حذف: {fact}",
        "memory_erase_all": "محو كل شيء",
        "memory_erase_confirm": "هل تريد محو كل ما يتذكره {bot} عنك؟ لا يمكن التراجع عن ذلك.",
        "memory_erase_yes": "محو",
        "memory_cancel": "إلغاء",
        "memory_erased": "تم المحو.",
        "memory_close": "إغلاق",
        "memory_failed": "لم ينجح ذلك: {problem}",
        "op_inbox": "صندوق الوارد",
        "op_count_label": "محادثات في انتظار أحد الموظفين",
        "op_notify": "نبّهني",
        "op_notifying": "التنبيهات مفعّلة",
        "op_notify_none": "التنبيهات غير متاحة هنا",
        "op_notify_blocked": "التنبيهات محظورة",
        "op_notify_blocked_short": "محظورة",
        "op_sound": "الصوت",
        "op_live": "مباشر",
        "op_unauthorized": "غير مصرّح",
        "op_waiting": "في الانتظار",
        "op_kind": "النوع",
        "op_kind_all": "الكل",
        "op_kind_approvals": "طلبات الموافقة",
        "op_kind_questions": "الأسئلة",
        "op_kind_takeovers": "المحادثات المُتولّاة",
        "op_conversation": "المحادثة",
        "op_pick": "اختر محادثة من القائمة.",
        "op_refused": "هذه الصفحة للموظفين: افتحها مع ?token=YOUR_TOKEN في نهاية عنوانها، "
                      "وهو رمز من ملف --auth الخاص بالخادم بالدور operators. قال الخادم: {problem}",
        "op_visitor": "زائر {id}",
        "op_nobody": "لا أحد في الانتظار.",
        "op_more": "مزيد من المحادثات المنتظرة",
        "op_chip_approval": "موافقة · {waited}",
        "op_chip_question": "سؤال · {waited}",
        "op_chip_takeover": "تولٍّ · {waited}",
        "op_with": "مع {name}",
        "op_you": "أنت",
        "op_note_waiting": "{name} · في الانتظار",
        "op_note_more": "{name} و{count} آخرون · في الانتظار",
        "op_back": "‹ القائمة",
        "op_on_route": "في {route}",
        "op_turns_one": "عدد الجولات: {n}",
        "op_turns_other": "عدد الجولات: {n}",
        "op_release_to": "إعادة المحادثة إلى مسار",
        "op_release_back": "إلى حيث كانت",
        "op_release_route": "إلى {route}",
        "op_release": "إعادة إلى البوت",
        "op_details": "التفاصيل",
        "op_held_by": "{name} يتولى هذه المحادثة (منذ {ago}): البوت صامت.",
        "op_take_over": "تولَّ المحادثة",
        "op_take_from": "تولَّ المحادثة بدلًا من {name}",
        "op_asked_person": "طلب المستخدم التحدث إلى شخص: {ask}",
        "op_bot_answers": "يرد البوت حتى تتولى المحادثة.",
        "op_you_have": "أنت تتولى هذه المحادثة (منذ {ago}): البوت صامت.",
        "op_placeholder": "اكتب بصفتك الموظف…",
        "op_message_label": "رسالة الموظف",
        "op_canned": "ردود جاهزة",
        "op_the_user": "المستخدم",
        "op_no_turns": "لا توجد جولات بعد.",
        "op_from": "{name} · موظف",
        "op_waiting_item": "في الانتظار ({kind} {id}): {ask}",
        "op_spoke": "تحدث الموظف",
        "op_gone": "هذه المحادثة لم تعد موجودة.",
    },
}
KEYS: frozenset[str] = frozenset(BUILTIN["en"])


def builtin_locale(locale: str | None) -> str:
    """The built-in locale whose texts the page shows for `locale` (exact, else by language; else en)."""
    if not locale:
        return "en"
    if locale in BUILTIN:
        return locale
    language = locale.split("-")[0].lower()
    return language if language in BUILTIN else "en"


@lru_cache(maxsize=64)
def direction(locale: str | None) -> str:
    """`rtl` for a locale written right to left (Arabic, Hebrew, Persian, Urdu...; CLDR's
    data, from Babel), else `ltr`."""
    if not locale:
        return "ltr"
    from babel import Locale  # only a bot with locales: asks

    try:
        return "rtl" if Locale.parse(locale.replace("-", "_")).text_direction == "rtl" else "ltr"
    except (ValueError, LookupError):
        return "ltr"


def page_texts(catalogs: Catalogs | None, locale: str | None) -> dict[str, str]:
    """Every text of the page in `locale`: the built-in English, then the built-in texts of
    the locale, then the bot's `page.*` texts in that locale."""
    texts = dict(BUILTIN["en"])
    texts.update(BUILTIN[builtin_locale(locale)])
    if catalogs is not None and locale is not None:
        for key, entry in catalogs.entries.get(locale, {}).items():
            if key.startswith(PREFIX) and key[len(PREFIX):] in KEYS and isinstance(entry.text, str):
                texts[key[len(PREFIX):]] = entry.text
    return texts


def confirm_choices(catalogs: Catalogs | None, locale: str | None) -> list[dict[str, str]]:
    """The buttons of a user's confirmation (`confirm:`), Yes and No in `locale`: the texts
    `yes` and `no` (a bot's `page.yes` and `page.no` replace them), with the values yes/no."""
    texts = page_texts(catalogs, locale)
    return [{"label": texts["yes"], "value": "yes"}, {"label": texts["no"], "value": "no"}]


def page_data(catalogs: Catalogs | None, locale: str | None) -> dict[str, object]:
    """What the page needs to show itself in `locale`: its `lang`, `dir` and texts."""
    return {"lang": locale or "en", "dir": direction(locale), "texts": page_texts(catalogs, locale)}


def about_operator(texts: dict[str, str], key: str, name: str | None) -> str:
    """The sentence `key` about an operator (`talking_to`, `operator_joined`...): filled with
    their name, or its `<key>_unnamed` text when they have none (None, or the data's stand-in
    UNNAMED_OPERATOR). One rule for the engine's notices; the page's app.js keeps the same."""
    if not name or name == UNNAMED_OPERATOR:
        return texts[f"{key}_unnamed"]
    return said(texts, key, name=name)


def said(texts: dict[str, str], key: str, **args: object) -> str:
    """The text of `key` with its `{name}` placeholders filled (as the page fills them: a bot's
    own text may hold other braces, which stay as written)."""
    text = texts[key]
    for name, value in args.items():
        text = text.replace("{" + name + "}", str(value))
    return text
