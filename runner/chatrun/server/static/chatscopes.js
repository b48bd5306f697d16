/*
 * chatscopes.js: a WebSocket client for chat routes, with the same API as the Quarkus
 * Chat Scopes JavaScript client (served at /_chat/javascript/chatscopes.js).
 *
 *   const client = new ChatScopesClient();
 *   await client.open("ws://localhost:8000/_chat/routes");
 *   const session = await client.builder()
 *       .messageHandler(text => console.log(text))
 *       .connect();                       // or connect("route")
 *   await session.chat("hello");          // resolves on Completed, rejects on Failed
 *
 * chatrun extensions (a Quarkus server ignores them): builder.resume(chatId) continues a
 * stored session; builder.bot(name) picks a bot on a shared endpoint; every request carries a
 * requestId; session.chatId / session.scopeId; session.close({keep: true}) detaches only.
 */
(function (root) {
  "use strict";

  function newId() {
    if (root.crypto && typeof root.crypto.randomUUID === "function") {
      return root.crypto.randomUUID();
    }
    return "c-" + Date.now().toString(36) + "-" + Math.random().toString(36).slice(2, 12);
  }

  class ChatRouteError extends Error {
    constructor(reason, message) {
      super(message || reason);
      this.name = "ChatRouteError";
      this.reason = reason;
    }
  }

  class Session {
    constructor(client, chatId, handlers) {
      this.client = client;
      this.chatId = chatId;
      this.scopeId = null;
      this.handlers = handlers;
      this.closed = false;
    }

    /** Send a user message to the current route. Promise resolves on Completed. */
    chat(userMessage) {
      return this.sendData({ userMessage: userMessage });
    }

    /** Send an object (its fields are the route's input data). */
    sendData(data) {
      if (data === null || typeof data !== "object") {
        return Promise.reject(new TypeError("sendData needs an object"));
      }
      return this.client._request(this, {
        type: "ChatRouteMessage",
        chatId: this.chatId,
        scopeId: this.scopeId,
        data: data,
      });
    }

    /** End the chat on the server (its session is deleted), or with {keep: true} only detach. */
    close(options) {
      const frame = { type: "Disconnect", chatId: this.chatId };
      if (options && options.keep) frame.keep = true;
      const done = this.client._request(this, frame);
      return done.finally(() => {
        this.closed = true;
        this.client.sessions.delete(this.chatId);
      });
    }

    _handle(type, data) {
      const handler = this.handlers.events[type];
      if (handler) {
        handler(data);
      } else if (this.handlers.defaultHandler) {
        this.handlers.defaultHandler(type, data);
      }
    }
  }

  class SessionBuilder {
    constructor(client) {
      this.client = client;
      this.handlers = { events: {}, defaultHandler: null };
      this._resume = null;
      this._bot = null;
    }
    eventHandler(eventType, handler) { this.handlers.events[eventType] = handler; return this; }
    errorHandler(handler) { return this.eventHandler("Error", handler); }
    messageHandler(handler) { return this.eventHandler("Message", handler); }
    consoleHandler(handler) { return this.eventHandler("Console", handler); }
    thinkingHandler(handler) { return this.eventHandler("Thinking", handler); }
    streamHandler(handler) { return this.eventHandler("Stream", handler); }
    objectHandler(handler) { return this.eventHandler("Object", handler); }
    /** chatrun extension: {route, stack} whenever the current route changes. */
    routeChangedHandler(handler) { return this.eventHandler("RouteChanged", handler); }
    defaultHandler(handler) { this.handlers.defaultHandler = handler; return this; }
    /** chatrun extension: continue a stored session instead of starting one. */
    resume(chatId) { this._resume = chatId; return this; }
    /** chatrun extension: which bot, when one endpoint serves several. */
    bot(name) { this._bot = name; return this; }

    /** Start a chat (on `route`, else the default route). Promise of a Session. */
    connect(route) {
      const chatId = this._resume || newId();
      const session = new Session(this.client, chatId, {
        events: Object.assign({}, this.handlers.events),
        defaultHandler: this.handlers.defaultHandler,
      });
      const frame = { type: "Connect", chatId: chatId };
      if (route) frame.route = route;
      if (this._resume) frame.resume = true;
      if (this._bot) frame.bot = this._bot;
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
      this._pending = new Map(); // requestId -> {session, resolve, reject, error}
      this._nextRequest = 1;
    }

    /** Open the WebSocket. Promise resolves once connected. */
    open(url) {
      return new Promise((resolve, reject) => {
        const ws = new WebSocket(url);
        this.websocket = ws;
        let opened = false;
        ws.onopen = () => { opened = true; resolve(this); };
        ws.onmessage = (msg) => this._onFrame(msg.data);
        ws.onerror = () => { if (!opened) reject(new Error("cannot open " + url)); };
        ws.onclose = (ev) => {
          const reason = ev.reason || "connection closed (code " + ev.code + ")";
          if (!opened) reject(new ChatRouteError("Closed", reason));
          this._failAll(new ChatRouteError("Closed", reason));
        };
      });
    }

    builder() {
      return new SessionBuilder(this);
    }

    close() {
      if (this.websocket) this.websocket.close();
    }

    _request(session, frame) {
      const ws = this.websocket;
      if (!ws || ws.readyState !== WebSocket.OPEN) {
        return Promise.reject(new ChatRouteError("Closed", "the connection is not open; call open(url) first"));
      }
      frame.requestId = this._nextRequest++;
      return new Promise((resolve, reject) => {
        this._pending.set(frame.requestId, { session: session, resolve: resolve, reject: reject, error: null });
        ws.send(JSON.stringify(frame));
      });
    }

    _waiter(frame) {
      if (frame.requestId !== undefined && frame.requestId !== null) {
        return [frame.requestId, this._pending.get(frame.requestId)];
      }
      // A server that does not echo requestId (Quarkus) answers a chat's requests in order.
      for (const [id, waiter] of this._pending) {
        if (waiter.session.chatId === frame.chatId) return [id, waiter];
      }
      return [null, undefined];
    }

    _onFrame(text) {
      let frame;
      try {
        frame = JSON.parse(text);
      } catch (e) {
        console.error("chatscopes: unreadable frame", text);
        return;
      }
      const [id, waiter] = this._waiter(frame);
      const session = (waiter && waiter.session) || this.sessions.get(frame.chatId);
      if (frame.type === "Completed") {
        if (typeof frame.data === "string") {
          if (session) session.scopeId = frame.data;
          const current = this.sessions.get(frame.chatId);
          if (current) current.scopeId = frame.data;
        }
        if (waiter) {
          this._pending.delete(id);
          waiter.resolve(frame.data);
        }
        return;
      }
      if (frame.type === "Failed") {
        if (waiter) {
          this._pending.delete(id);
          const message = waiter.error ? waiter.error + " (" + frame.data + ")" : frame.data;
          waiter.reject(new ChatRouteError(frame.data, message));
        }
        return;
      }
      if (frame.type === "Error" && waiter) waiter.error = frame.data;
      if (session) {
        session._handle(frame.type, frame.data);
      } else if (frame.type === "Error") {
        console.error("chatscopes:", frame.data);
      }
    }

    _failAll(error) {
      for (const waiter of this._pending.values()) waiter.reject(error);
      this._pending.clear();
    }
  }

  root.ChatScopesClient = ChatScopesClient;
  root.ChatRouteError = ChatRouteError;
  if (typeof module !== "undefined" && module.exports) {
    module.exports = { ChatScopesClient: ChatScopesClient, ChatRouteError: ChatRouteError };
  }
})(typeof window !== "undefined" ? window : globalThis);
