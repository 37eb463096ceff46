(() => {
  const rec = new Map();
  window.__tk_texts = rec;
  const P = CanvasRenderingContext2D.prototype;
  const fill = P.fillText, clear = P.clearRect, save = P.save, restore = P.restore, rect = P.rect, clip = P.clip;
  const state = new WeakMap();
  const st = (ctx) => { if (!state.has(ctx)) state.set(ctx, {clip: null, stack: [], rect: null}); return state.get(ctx); };
  const box = (ctx, x, y, w, h) => {
    const t = ctx.getTransform();
    const xs = [x, x + w].flatMap((px) => [y, y + h].map((py) => t.a * px + t.c * py + t.e));
    const ys = [x, x + w].flatMap((px) => [y, y + h].map((py) => t.b * px + t.d * py + t.f));
    return [Math.min(...xs), Math.min(...ys), Math.max(...xs), Math.max(...ys)];
  };
  P.save = function () { const s = st(this); s.stack.push(s.clip); return save.apply(this, arguments); };
  P.restore = function () { const s = st(this); s.clip = s.stack.length ? s.stack.pop() : null; return restore.apply(this, arguments); };
  P.rect = function (x, y, w, h) { st(this).rect = box(this, x, y, w, h); return rect.apply(this, arguments); };
  P.clip = function () {
    const s = st(this);
    if (s.rect) s.clip = s.clip ? [Math.max(s.clip[0], s.rect[0]), Math.max(s.clip[1], s.rect[1]),
                                    Math.min(s.clip[2], s.rect[2]), Math.min(s.clip[3], s.rect[3])] : s.rect;
    return clip.apply(this, arguments);
  };
  P.clearRect = function (x, y, w, h) {
    const c = this.canvas;
    if (x <= 0 && y <= 0 && w >= c.width && h >= c.height) rec.set(c, []);
    return clear.apply(this, arguments);
  };
  P.fillText = function (text, x, y) {
    const c = this.canvas;
    if (!rec.has(c)) rec.set(c, []);
    const m = this.measureText(text);
    const left = x - m.actualBoundingBoxLeft, right = x + m.actualBoundingBoxRight;
    const top = y - m.actualBoundingBoxAscent, bottom = y + m.actualBoundingBoxDescent;
    const t = this.getTransform();
    const pt = (px, py) => [t.a * px + t.c * py + t.e, t.b * px + t.d * py + t.f];
    if (String(text).trim() && right > left)
      rec.get(c).push({text: String(text), clip: st(this).clip,
                       quad: [pt(left, top), pt(right, top), pt(right, bottom), pt(left, bottom)]});
    return fill.apply(this, arguments);
  };
})();
