// The chat follows the conversation, as chat products do: while the user is at the bottom, the
// view stays at the bottom however the content grows (a streamed word, a tool card filling in,
// a question card, a collapsed JSON opened); once the user scrolls up to read, it stays put and
// a "New messages ↓" button appears when something new lands below. Sending always goes back to
// the bottom. Growth is watched with a ResizeObserver on the content, so no code path that adds
// or grows a part can forget to scroll (the old "was it near the bottom before this change?"
// check broke for good after one change it did not wrap).

/** How close to the bottom (px) still counts as "at the bottom" when the user scrolls. */
const AT_BOTTOM_PX = 24;

export class ChatFollower {
  /**
   * @param {HTMLElement} scroller The element that scrolls (#chat-scroll).
   * @param {HTMLElement} content What grows inside it (#messages).
   * @param {HTMLButtonElement} button The "New messages ↓" button (hidden while following).
   */
  constructor(scroller, content, button) {
    this.scroller = scroller;
    this.button = button;
    /** true while the view keeps to the bottom */
    this.following = true;
    this._lastTop = scroller.scrollTop;
    this._height = content.getBoundingClientRect().height;
    scroller.addEventListener("scroll", () => this._onScroll(), { passive: true });
    button.addEventListener("click", () => this.toBottom());
    const grew = () => {
      const height = content.getBoundingClientRect().height;
      const taller = height > this._height + 0.5;
      this._height = height;
      if (this.following) this._stick();
      else if (taller) this._showButton();
    };
    new ResizeObserver(grew).observe(content);
    new ResizeObserver(() => { if (this.following) this._stick(); }).observe(scroller); // the keyboard, a rotation
  }

  /** Back to the bottom, and follow from now on (the user sent a message, or asked to). */
  toBottom() {
    this.following = true;
    this.button.hidden = true;
    this._stick();
  }

  /** Distance (px) from the bottom of what is shown to the bottom of the content. */
  distance() {
    const s = this.scroller;
    return Math.max(0, s.scrollHeight - s.scrollTop - s.clientHeight);
  }

  _stick() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this._lastTop = this.scroller.scrollTop;
  }

  _showButton() {
    if (this.distance() > AT_BOTTOM_PX) this.button.hidden = false;
  }

  /**
   * A scroll: ours (to the bottom) keeps following; the user's upwards stops it; the user's
   * back to the bottom starts it again.
   */
  _onScroll() {
    const top = this.scroller.scrollTop;
    const up = top < this._lastTop - 1;
    this._lastTop = top;
    if (this.distance() <= AT_BOTTOM_PX) {
      this.following = true;
      this.button.hidden = true;
    } else if (up) {
      this.following = false;
    }
  }
}
