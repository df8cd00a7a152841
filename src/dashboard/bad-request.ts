/** A request a page cannot answer as asked: the server answers 400 with the message, which names what was wrong. */
export class BadRequest extends Error {
  constructor(message: string) {
    super(message);
    this.name = "BadRequest";
  }
}
