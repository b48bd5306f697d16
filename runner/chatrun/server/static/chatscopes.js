/*
 * chatscopes.js: a WebSocket client for chat routes, served at /_chat/javascript/chatscopes.js.
 *
 * A superset of the Quarkus Chat Scopes JavaScript client: every public member of it, with the
 * same behaviour, so a page written for Quarkus works with this file unchanged.
 *
 *   const client = new ChatScopesClient();
 *   await client.open("ws://localhost:8000/_chat/routes");
 *   const session = await client.builder()
 *       .messageHandler(text => console.log(text))
 *       .connect();                       // or connect("route")
 *   await session.chat("hello");          // resolves on Completed, rejects on Failed
 *
 * As in Quarkus: ChatScopesClient.open(endpoint) / builder() / send(message) / onMessage(event) /
 * websocket / sessions / counter; SessionBuilder.eventHandler / messageHandler / errorHandler /
 * consoleHandler / thinkingHandler / streamHandler / objectHandler / defaultHandler / connect(route),
 * with console.log handlers pre-registered for Message, Thinking, Console and SystemError (so
 * those never reach the defaultHandler); Session.chat(userMessage) / sendData(data) /
 * sendEvent(type, data) / id / currentScope. A rejected promise carries an Error whose message
 * is the Failed reason.
 *
 * chatrun's extras: the Connect asks for chatrun's extensions (RouteChanged events, the full
 * Message after Stream chunks, an Error frame saying why before a Failed; builder.extensions(false)
 * asks for the Quarkus frames only); builder.routeChangedHandler(fn), builder.resume(chatId)
 * continues a stored session, builder.bot(name) picks a bot on a shared endpoint,
 * builder.streamEvery(ms or "reader") asks for fewer Stream events; every request
 * carries a requestId, so several requests of one session may be in flight; a rejection is a
 * ChatRouteError with `reason`, `detail` (the Error text) and `ran` (the tools with an outside
 * effect a failed turn ran: sending it again repeats them; [] when none); session.close({keep}) sends
 * Disconnect; session.chatId / session.scopeId are id / currentScope; client.close().
 * Unlike the Quarkus file, sessions built from one builder do not share their handler map, and
 * a page with no defaultHandler never breaks on an unhandled frame type (it is logged).
 */
(function (root) {
  "use strict";
  const TURN_TYPES = ["ChatRouteMessage", "Decide", "Answer"]; // the requests that run a turn

  function newId() {
    if (root.crypto && typeof root.crypto.randomUUID === "function") {
      return root.crypto.randomUUID();
    }
    return "c-" + Date.now().toString(36) + "-" + Math.random().toString(36).slice(2, 12);
  }

  /** The rejection of a request: `message` and `reason` are the Failed reason (as Quarkus'
   * `new Error(reason)`), `detail` the Error frame's text when the server sent one, `ran` the
   * Failed frame's tools with an outside effect that ran in the failed turn ([] when none). */
  class ChatRouteError extends Error {
    constructor(reason, detail, ran) {
      super(reason);
      this.name = "ChatRouteError";
      this.reason = reason;
      this.detail = detail || null;
      this.ran = Array.isArray(ran) ? ran : [];
    }
  }

  class Session {
    constructor(builder, id) {
      this.client = builder.client;
      this.id = id;
      this.currentScope = undefined;
      this.eventHandlers = new Map(builder.eventHandlers);
      this.defaultHandler = builder._defaultHandler || null;
      this.extensions = builder._extensions;
      this.closed = false;
      // chatrun extra: "auto" | "always" | null. Set, each turn this session sends plays the model
      // (docs/protocol.md, "Playing the model"): its model calls come as ModelRequest events
      // (register an eventHandler("ModelRequest", …)) and answerModel() answers them.
      this.playModel = null;
      // chatrun extra: milliseconds between Stream events the turns this session sends ask for.
      this.streamEvery = builder._streamEvery || null;
    }

    /** chatrun names of id and currentScope. */
    get chatId() { return this.id; }
    get scopeId() { return this.currentScope === undefined ? null : this.currentScope; }

    /** Send a user message to the current route. Promise resolves on Completed. */
    chat(userMessage) {
      return this.sendData({ userMessage: userMessage });
    }

    /** Send an object (its fields are the route's input data). */
    sendData(data) {
      return this.sendEvent("ChatRouteMessage", data);
    }

    /** Send a frame of any type for this chat, with the current scope. Promise of its end. */
    sendEvent(type, data) {
      return this.client._request(this, { type: type, chatId: this.id, scopeId: this.currentScope, data: data });
    }

    /** chatrun extra (a chat with extensions): stop this chat's running turn. The turn is
     * rolled back (docs/protocol.md, "Stop") and its request rejects with Failed("Cancelled").
     * Promise of the Cancel's own Completed. */
    cancel() {
      return this.client._request(this, { type: "Cancel", chatId: this.id });
    }

    /** chatrun extra: answer a ModelRequest (its data.ask) as the model: {text} or {tool, arguments}.
     * The waiting turn goes on. Promise of the ModelAnswer's own Completed. */
    answerModel(ask, answer) {
      const frame = { type: "ModelAnswer", chatId: this.id, ask: ask };
      if (answer.tool) {
        frame.tool = answer.tool;
        frame.arguments = answer.arguments || {};
      } else {
        frame.text = answer.text;
      }
      return this.client._request(this, frame);
    }

    /** chatrun extra: rate the reply of turn `turn`: "up" or "down", with an optional comment.
     * Promise of its Completed (the rating is kept in the session's history). */
    feedback(turn, rating, comment) {
      const frame = { type: "Feedback", chatId: this.id, turn: turn, rating: rating };
      if (comment) frame.comment = comment;
      return this.client._request(this, frame);
    }

    /** chatrun extra: end the chat on the server (its session is deleted), or with {keep: true}
     * only detach it from this connection. */
    close(options) {
      const frame = { type: "Disconnect", chatId: this.id };
      if (options && options.keep) frame.keep = true;
      const done = () => {
        this.closed = true;
        this.client.sessions.delete(this.id);
      };
      if (!this.extensions) { // Quarkus answers a Disconnect with no frame: nothing to wait for
        this.client.send(frame);
        done();
        return Promise.resolve(null);
      }
      return this.client._request(this, frame).finally(done);
    }

    _handle(type, data) {
      const handler = this.eventHandlers.get(type);
      if (handler) {
        handler(data);
      } else if (this.defaultHandler) {
        this.defaultHandler(type, data);
      } else {
        console.log("Handler not found for eventType: " + type);
      }
    }
  }

  class SessionBuilder {
    constructor(client) {
      this.client = client;
      this.eventHandlers = new Map();
      this._defaultHandler = null;
      this._resume = null;
      this._bot = null;
      this._extensions = true;
      // As the Quarkus builder: these types are logged unless the page registers its own.
      this.consoleHandler((message) => { console.log(message); });
      this.thinkingHandler((message) => { console.log(message); });
      this.eventHandlers.set("SystemError", (message) => { console.log("SystemError: " + message); });
      this.eventHandlers.set("Message", (message) => { console.log("Message: " + message); });
    }
    eventHandler(eventType, handler) { this.eventHandlers.set(eventType, handler); return this; }
    errorHandler(handler) { return this.eventHandler("Error", handler); }
    messageHandler(handler) { return this.eventHandler("Message", handler); }
    consoleHandler(handler) { return this.eventHandler("Console", handler); }
    thinkingHandler(handler) { return this.eventHandler("Thinking", handler); }
    streamHandler(handler) { return this.eventHandler("Stream", handler); }
    objectHandler(handler) { return this.eventHandler("Object", handler); }
    /** fn(type, data) for every event type with no handler of its own. */
    defaultHandler(handler) { this._defaultHandler = handler; return this; }
    /** chatrun extra: {route, stack} whenever the current route changes. */
    routeChangedHandler(handler) { return this.eventHandler("RouteChanged", handler); }
    /** chatrun extra: continue a stored session instead of starting one. */
    resume(chatId) { this._resume = chatId; return this; }
    /** chatrun extra: which bot, when one endpoint serves several. */
    bot(name) { this._bot = name; return this; }
    /** chatrun extra: false asks the server for exactly the frames a Quarkus server sends. */
    extensions(on) { this._extensions = on !== false; return this; }
    /** chatrun extra: the locale a new chat asks for (`de`, `pt-BR`; docs/i18n.md). */
    locale(tag) { this._locale = tag; return this; }
    /** chatrun extra: at most one Stream event every `ms` milliseconds (50 to 1000; the server's
     * default is 50): a client that shows a reply less often need not receive it more often; or
     * "reader": a reader's pace (four a second, fewer while a reply comes faster than anyone reads;
     * engine/stream_chunks.py READER), what chatrun's page draws. */
    streamEvery(ms) { this._streamEvery = ms; return this; }

    /** Start a chat (on `route`, else the default route). Promise of a Session. */
    connect(route) {
      const chatId = this._resume || newId();
      this.client.counter++;
      const session = new Session(this, chatId);
      const frame = { type: "Connect", chatId: chatId };
      if (route !== undefined && route !== null) frame.route = route;
      if (this._extensions) frame.extensions = true;
      if (this._resume) frame.resume = true;
      if (this._bot) frame.bot = this._bot;
      if (this._locale && !this._resume) frame.locale = this._locale;
      this.client.sessions.set(chatId, session);
      return this.client._request(session, frame).then(
        () => session,
        (err) => {
          this.client.sessions.delete(chatId);
          throw err;
        }
      );
    }
  }

  class ChatScopesClient {
    constructor() {
      this.websocket = null;
      this.sessions = new Map(); // chatId -> Session
      this.counter = 0; // sessions built, as in Quarkus (chatrun's chatIds are UUIDs)
      this._pending = new Map(); // requestId -> {session, resolve, reject, error}
      this._nextRequest = 1;
    }

    /** Open the WebSocket. Promise resolves once connected (rejects if it cannot open). */
    open(endpoint) {
      return new Promise((resolve, reject) => {
        const ws = new WebSocket(endpoint);
        this.websocket = ws;
        let opened = false;
        ws.onopen = () => { opened = true; resolve(this); };
        ws.onmessage = (event) => { this.onMessage(event); };
        ws.onerror = () => { if (!opened) reject(new Error("cannot open " + endpoint)); };
        ws.onclose = (ev) => {
          console.log("WebSocket connection closed");
          const reason = ev.reason || "connection closed (code " + ev.code + ")";
          if (!opened) reject(new ChatRouteError("Closed", reason));
          this._failAll(new ChatRouteError("Closed", reason));
        };
      });
    }

    builder() {
      return new SessionBuilder(this);
    }

    /** Send one frame as JSON, as is. */
    send(message) {
      this.websocket.send(JSON.stringify(message));
    }

    /** chatrun extra: close the WebSocket (pending requests reject with reason "Closed"). */
    close() {
      if (this.websocket) this.websocket.close();
    }

    /** One WebSocket message event from the server: dispatch it to its session. */
    onMessage(event) {
      let frame;
      try {
        frame = JSON.parse(event.data);
      } catch (e) {
        console.error("chatscopes: unreadable frame", event.data);
        return;
      }
      const [id, waiter] = this._waiter(frame);
      const session = (waiter && waiter.session) || this.sessions.get(frame.chatId);
      if (frame.type === "Completed") {
        if (typeof frame.data === "string" && session) session.currentScope = frame.data;
        if (waiter) {
          this._pending.delete(id);
          waiter.resolve(frame.data);
        }
        return;
      }
      if (frame.type === "Failed") {
        if (waiter) {
          this._pending.delete(id);
          waiter.reject(new ChatRouteError(frame.data, waiter.error, frame.ran));
        }
        return;
      }
      if (frame.type === "Error" && waiter) waiter.error = frame.data;
      if (session) {
        session._handle(frame.type, frame.data);
      } else {
        console.log("Session not found for chatId: " + frame.chatId);
      }
    }

    _request(session, frame) {
      const ws = this.websocket;
      if (!ws || ws.readyState !== WebSocket.OPEN) {
        return Promise.reject(new ChatRouteError("Closed", "the connection is not open; call open(url) first"));
      }
      frame.requestId = this._nextRequest++;
      if (session.playModel && TURN_TYPES.includes(frame.type)) frame.playModel = session.playModel;
      if (session.streamEvery && session.extensions && TURN_TYPES.includes(frame.type)) frame.streamEvery = session.streamEvery;
      return new Promise((resolve, reject) => {
        this._pending.set(frame.requestId, { session: session, resolve: resolve, reject: reject, error: null });
        this.send(frame);
      });
    }

    _waiter(frame) {
      if (frame.requestId !== undefined && frame.requestId !== null) {
        return [frame.requestId, this._pending.get(frame.requestId)];
      }
      // A server that does not echo requestId (Quarkus) answers a chat's requests in order.
      for (const [id, waiter] of this._pending) {
        if (waiter.session.id === frame.chatId) return [id, waiter];
      }
      return [null, undefined];
    }

    _failAll(error) {
      for (const waiter of this._pending.values()) waiter.reject(error);
      this._pending.clear();
    }
  }

  root.ChatScopesClient = ChatScopesClient;
  root.ChatRouteError = ChatRouteError;
  root.SessionBuilder = SessionBuilder;
  root.Session = Session;
  if (typeof module !== "undefined" && module.exports) {
    module.exports = { ChatScopesClient, ChatRouteError, SessionBuilder, Session };
  }
})(typeof window !== "undefined" ? window : globalThis);
