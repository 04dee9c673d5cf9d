// A small incremental Server-Sent Events parser (the WHATWG event-stream format).
// Feed it decoded text as it arrives; it returns the whole events seen so far and keeps
// the unfinished tail, so an event split across reads (or a CRLF split in two) is fine.

export class SSEParser {
  constructor() {
    this.buffer = "";
    this.reset();
  }

  reset() {
    this.event = "";
    this.data = [];
    this.comments = [];
  }

  /** @param {string} text @returns {{event: string, data: string, comments: string[]}[]} */
  feed(text) {
    this.buffer += text;
    const out = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (match === null) break;
      // a lone "\r" at the very end may be the first half of "\r\n": wait for more
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const done = this.line(line);
      if (done !== null) out.push(done);
    }
    return out;
  }

  /** The stream ended: an unterminated last event still counts. */
  end() {
    const out = this.feed("\n\n");
    this.buffer = "";
    return out;
  }

  line(line) {
    if (line === "") {
      if (this.data.length === 0 && this.comments.length === 0) {
        this.reset();
        return null;
      }
      const done = { event: this.event || "message", data: this.data.join("\n"),
                     comments: this.comments };
      this.reset();
      return done;
    }
    if (line.startsWith(":")) {
      this.comments.push(line.slice(1).trimStart());
      return null;
    }
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    return null;
  }
}
